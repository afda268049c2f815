"""Workers that start warm: one process imports torch once, then forks each worker.

A worker that starts cold spends most of its start-up importing: `import torch` (1.3 s
on a 2-core machine), `torch.distributed.tensor` (0.6 s, which a checkpoint restore
needs) and `torch._dynamo` (0.6 s, imported by the first optimizer), before the job's
own modules. Every start, restart and resize of a scheduled job pays it again. The
scheduler's local backend runs one fork server beside it (`python -m tandem.forkserver
--socket PATH --owner PID [--import MODULE ...]`): it imports those modules, then waits
on a Unix socket in a directory only its user can open. Asked by `tandem/local_agent.py`
for a worker (the command line, the environment, the working directory and the three
standard streams, passed as file descriptors), it forks; the child takes the streams,
the environment and the directory, and runs the script as `python -u SCRIPT ARGS` (or
`python -u -m MODULE ARGS`) would, with `__name__ == "__main__"`.

The server answers with the child's pid, and when the child ends, with its exit status
in `subprocess.Popen.returncode`'s terms (-N for a signal). The agent signals its
workers by pid as before. If the agent's connection closes while its worker runs (the
agent was killed), the server kills the worker: nothing outlives the attempt.

A worker starts cold instead (the agent says so in one line) where a warm one could
differ from it: another interpreter or interpreter flags, other `PYTHON*` or `LD_*`
variables (read when an interpreter starts; PYTHONPATH may differ where it would not
bring another copy of a module the server imported), or a server that is not single-threaded
(a fork copies only the calling thread; numpy's OpenBLAS pool is kept to one thread
here, and nothing the server imports may start another) or one whose imports loaded the
CUDA driver (nothing of torch's does on import; a GPU worker then starts cold, never
broken). After the fork the child
seeds `random` (and numpy's global generator) afresh, as a new interpreter would, and
sets torch's thread count from OMP_NUM_THREADS.

The server stops taking requests when its owner (the scheduler) exits or on SIGTERM,
and exits once its last worker has: attempts outlive the scheduler, as they do cold.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import warnings
from typing import Any

DEFAULT_IMPORTS = ("torch", "torch.distributed", "torch.distributed.checkpoint",
                   "torch.distributed.tensor", "torch._dynamo", "tandem.fit")
# Variables an interpreter reads when it starts: a worker that wants other values than
# the server started with cannot be forked from it.
START_PREFIXES = ("PYTHON", "LD_")
HEADER = struct.Struct("!I")  # a message's length, before its JSON
FORKSERVER_ENV = "TANDEM_FORKSERVER"  # the socket, in a launcher's environment
STREAMS = 3  # stdin, stdout, stderr
REAP_S = 0.05
SERVER_PATH: list[str] = []  # the fork server's own PYTHONPATH entries, as in sys.path


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


def python_path(value: str, cwd: str) -> list[str]:
    """The `sys.path` entries a new interpreter makes of PYTHONPATH `value` in `cwd`."""
    if not value:
        return []
    return [os.path.abspath(os.path.join(cwd, p)) for p in value.split(os.pathsep)]


def shadowed(entries: list[str]) -> str | None:
    """Which module imported here a worker with these PYTHONPATH entries would import
    from somewhere else (None if none would)."""
    for entry in entries:
        if entry in SERVER_PATH:
            continue
        for name, module in list(sys.modules.items()):
            where = getattr(module, "__file__", None)
            if "." in name or not where:
                continue
            for candidate in (os.path.join(entry, name), os.path.join(entry, f"{name}.py")):
                if os.path.exists(candidate) and not where.startswith(candidate):
                    return (f"PYTHONPATH entry {entry} holds {name}, which the fork server "
                            f"imported from {where}")
    return None


def incompatibility(argv: list[str], env: dict[str, str], cwd: str) -> str | None:
    """Why a worker with this command line and environment cannot be forked from this
    process (None if it can)."""
    if not argv or os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
        return f"another interpreter ({argv[:1]}, not {sys.executable})"
    rest = argv[1:]
    if rest[:1] == ["-u"]:
        rest = rest[1:]
    if not rest or (rest[0].startswith("-") and rest[0] != "-m") or rest[:1] == ["-m"] \
            and len(rest) < 2:
        return f"interpreter options other than -u ({argv[1:3]})"
    for key in sorted({*env, *os.environ}):
        if key.startswith(START_PREFIXES) and key != "PYTHONPATH" \
                and env.get(key) != os.environ.get(key):
            return f"{key} differs from the fork server's"
    clash = shadowed(python_path(env.get("PYTHONPATH", ""), cwd))
    if clash is not None:
        return clash
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        return f"the fork server runs {threads} threads"
    if cuda_loaded():
        return "the fork server's imports loaded the CUDA driver, which a fork cannot share"
    return None


def cuda_loaded() -> bool:
    """Whether this process has loaded the CUDA driver (it does on its first CUDA call,
    even `torch.cuda.is_available()`); a child forked after that cannot use CUDA."""
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        return any("libcuda.so" in line for line in maps)


def run_worker(argv: list[str], env: dict[str, str], cwd: str) -> int:
    """In the forked child: become `argv` and run it; return its exit status."""
    rest = argv[1:]
    if rest[:1] == ["-u"]:
        rest = rest[1:]
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=True)
    _fresh_state(env)
    import runpy

    entries = python_path(env.get("PYTHONPATH", ""), cwd)
    kept = sys.path[1 + len(SERVER_PATH):] if sys.path[1:1 + len(SERVER_PATH)] == SERVER_PATH \
        else sys.path[1:]
    sys.path[1:] = list(dict.fromkeys([*entries, *kept]))  # as `site` leaves it: no repeats
    if rest[0] == "-m":
        # The module may have been imported here before the fork; runpy runs it afresh
        # as __main__ either way, as `python -m` does, and need not say so.
        warnings.filterwarnings("ignore", category=RuntimeWarning,
                                message=".*found in sys.modules after import of package")
        sys.argv = ["-m", *rest[2:]]
        sys.path[0] = cwd
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        script = os.path.abspath(rest[0])
        sys.argv = [rest[0], *rest[1:]]
        sys.path[0] = os.path.dirname(script)
        runpy.run_path(script, run_name="__main__")
    return 0


def _fresh_state(env: dict[str, str]) -> None:
    """What a new interpreter would start with: unseeded generators, its thread count."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None and env.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(max(1, int(env["OMP_NUM_THREADS"])))


def child_main(request: dict[str, Any], fds: list[int]) -> None:
    """The forked child: take the streams, run the worker, exit as an interpreter does."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    code = 1
    interrupted = False
    try:
        code = run_worker(request["argv"], request["env"], request["cwd"])
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except KeyboardInterrupt as err:
        traceback.print_exception(err.with_traceback(_own_frames(err.__traceback__)))
        interrupted = True
    except BaseException as err:  # noqa: BLE001 - an interpreter prints it and exits 1
        err = err.with_traceback(_own_frames(err.__traceback__))
        sys.excepthook(type(err), err, err.__traceback__)
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_Finalize does first
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if interrupted:  # as CPython: die of SIGINT, so the parent sees it
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code & 0xFF)


def _own_frames(tb: Any) -> Any:
    """The traceback from the worker's own first frame on (not this module's, not
    runpy's), as an interpreter that ran the script would print it."""
    while tb is not None and tb.tb_next is not None and (
            tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>")):
        tb = tb.tb_next
    return tb


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


class Server:
    """The fork server's loop: accept requests, fork, report exits, kill orphans."""

    def __init__(self, path: str, owner: int) -> None:
        self.path = path
        self.owner = owner
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, socket.socket] = {}  # pid -> its agent's connection
        self.stopping = False

    def serve(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self._stop())
        tmp = f"{self.path}.{os.getpid()}"
        self.listener.bind(tmp)
        os.chmod(tmp, 0o600)
        self.listener.listen(64)
        os.rename(tmp, self.path)  # ready: a client finds the socket only once it listens
        self.selector.register(self.listener, selectors.EVENT_READ)
        while not (self.stopping and not self.children):
            if not self.stopping and os.getppid() != self.owner:
                self._stop()
            for key, _ in self.selector.select(REAP_S):
                if key.fileobj is self.listener:
                    self._accept()
                else:
                    self._closed(key.fileobj)
            self._reap()
        return 0

    def _stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.selector.unregister(self.listener)
        self.listener.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(5.0)
        try:
            if _peer_uid(conn) != os.getuid():
                conn.close()
                return
            head, fds, _, _ = socket.recv_fds(conn, HEADER.size, STREAMS)
            if len(head) < HEADER.size:
                head += recv_exact(conn, HEADER.size - len(head))
            request = json.loads(recv_exact(conn, HEADER.unpack(head)[0]))
        except (OSError, ValueError, struct.error) as err:
            conn.close()
            print(f"tandem forkserver: bad request: {err}", file=sys.stderr)
            return
        why = incompatibility(request.get("argv", []), request.get("env", {}),
                              request.get("cwd", "/"))
        if why is None and len(fds) != STREAMS:
            why = f"{len(fds)} file descriptors came, {STREAMS} needed"
        if why is not None:
            for fd in fds:
                os.close(fd)
            self._reply(conn, {"error": why})
            conn.close()
            return
        pid = os.fork()
        if pid == 0:
            self.selector.close()
            self.listener.close()
            for other in self.children.values():
                other.close()
            conn.close()
            child_main(request, fds)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        self._reply(conn, {"pid": pid})
        conn.setblocking(False)
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def _reply(self, conn: socket.socket, message: dict[str, Any]) -> None:
        try:
            send_message(conn, message)
        except OSError:
            pass

    def _closed(self, conn: Any) -> None:
        """The agent's connection is readable: it closed (it sends nothing else)."""
        pid = self.selector.get_key(conn).data
        try:
            if conn.recv(1):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self.selector.unregister(conn)
        conn.close()
        if pid in self.children:
            try:
                os.kill(pid, signal.SIGKILL)  # the agent is gone: so is its worker
            except ProcessLookupError:
                pass

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None or conn.fileno() < 0:
                continue
            self._reply(conn, {"exit": os.waitstatus_to_exitcode(status)})
            self.selector.unregister(conn)
            conn.close()


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _public_names() -> None:
    """Point tandem's public names at what they name, as their first use would: an
    import of the submodule `tandem.fit` made `tandem.fit` that module, where a script's
    `tandem.fit(task)` means the function."""
    package = sys.modules.get("tandem")
    if package is None:
        return
    for name, home in package._HOMES.items():
        if home in sys.modules:
            setattr(package, name, getattr(sys.modules[home], name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tandem.forkserver")
    parser.add_argument("--socket", required=True, help="where to listen (a new path)")
    parser.add_argument("--owner", type=int, required=True,
                        help="the process whose exit stops the server taking requests")
    parser.add_argument("--import", dest="modules", action="append", default=[],
                        help="a module to import before the first fork (repeatable; "
                             "added to the defaults)")
    ns = parser.parse_args(argv)
    started = time.perf_counter()
    # Before any import reads them: numpy's OpenBLAS starts no thread pool (a fork copies
    # only the calling thread), and torch's OpenMP default is the machine's, as in a new
    # interpreter without OMP_NUM_THREADS (a worker with it gets it after the fork).
    SERVER_PATH[:] = python_path(os.environ.get("PYTHONPATH", ""), os.getcwd())
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.pop(key, None)
    for name in (*DEFAULT_IMPORTS, *ns.modules):
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - a module that fails stays cold
            print(f"tandem forkserver: could not import {name}: {err}", file=sys.stderr)
    _public_names()
    gc.collect()
    gc.freeze()  # the imports' objects stay put: a fork shares their pages
    threads = len(os.listdir("/proc/self/task"))
    print(f"tandem forkserver: pid {os.getpid()}, imports took "
          f"{time.perf_counter() - started:.2f} s, {threads} thread(s)", file=sys.stderr)
    return Server(ns.socket, ns.owner).serve()


if __name__ == "__main__":
    raise SystemExit(main())
