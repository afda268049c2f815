"""The fork server's wire protocol: length-prefixed JSON messages over a Unix socket.

Standard library only: `tandem/launcher/local_agent.py` loads this file by path (a job's
PYTHONPATH, which the agent inherits, may hold another `tandem`), and the scheduler's
backend and the server (`tandem/forking/server.py`) import it.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

HEADER = struct.Struct("!I")  # a message's length, before its JSON
FORKSERVER_ENV = "TANDEM_FORKSERVER"  # the socket, in a launcher's environment


def recv_exact(sock: socket.socket, size: int) -> bytes:
    """`size` bytes from a blocking socket; OSError if it closes first."""
    chunks = []
    while size:
        data = sock.recv(size)
        if not data:
            raise OSError("the connection closed in the middle of a message")
        chunks.append(data)
        size -= len(data)
    return b"".join(chunks)


def send_message(sock: socket.socket, message: dict[str, Any],
                 fds: list[int] | None = None) -> None:
    """A length-prefixed JSON message, the file descriptors on its first byte."""
    body = json.dumps(message).encode()
    data = HEADER.pack(len(body)) + body
    if fds:
        data = data[socket.send_fds(sock, [data], fds):]
    if data:  # (sendall of nothing still sends: EPIPE where the peer has answered and gone)
        sock.sendall(data)


def read_message(sock: socket.socket) -> dict[str, Any]:
    """One message from a blocking socket."""
    head = recv_exact(sock, HEADER.size)
    message = json.loads(recv_exact(sock, HEADER.unpack(head)[0]))
    if not isinstance(message, dict):
        raise ValueError(f"a message must be a JSON object, not {type(message).__name__}")
    return message


def kill_forked(path: str, marker: str, timeout: float = 10.0) -> list[int]:
    """SIGKILL the workers the server at `path` forked for the attempt with `marker`;
    returns their pids ([] where the server is not there)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.settimeout(timeout)
            sock.connect(path)
            send_message(sock, {"kill": marker})
            return [int(pid) for pid in read_message(sock).get("killed", [])]
        except (OSError, ValueError):
            return []
