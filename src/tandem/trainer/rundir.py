"""The run directory: a lease held by the run that writes it, and its recorded config.

Only one run may write `<run.dir>/<name>` at a time: two would replace each other's
checkpoints and retention would delete the other's. Rank 0 holds an exclusive `flock`
on the directory for the run's life (the kernel releases it when the process dies, so
a killed run leaves no stale lock on a local file system) and, once it trains, writes
`.owner.json` (host, pid, start time, command) so that a second launch can say who
holds it. On shared file systems whose `flock` is not shared across hosts, the owner
file is the only guard: its heartbeat-free content is advice, not a lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch.distributed as dist

from tandem.config import Config
from tandem.errors import UsageError
from tandem.runtime import Runtime

OWNER_FILE = ".owner.json"


class Lease:
    """Rank 0's hold on a run directory (a no-op object on other ranks)."""

    def __init__(self, run_dir: Path, fd: int | None) -> None:
        self.run_dir, self.fd = run_dir, fd
        self.claimed = False

    def claim(self) -> None:
        """Say who holds the directory (written only by a run that goes on to write)."""
        if self.fd is None or self.claimed:
            return
        owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                 "command": " ".join(sys.argv)}
        _write_atomic(self.run_dir / OWNER_FILE, json.dumps(owner) + "\n")
        self.claimed = True

    def release(self) -> None:
        """Let go of the directory (the owner note goes with it)."""
        if self.fd is None:
            return
        if self.claimed:
            (self.run_dir / OWNER_FILE).unlink(missing_ok=True)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


def _holder(run_dir: Path) -> str:
    try:
        owner = json.loads((run_dir / OWNER_FILE).read_text())
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner["started"]))
        return (f"pid {owner['pid']} on {owner['host']} since {since} "
                f"(`{owner['command']}`)")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def _lock(run_dir: Path) -> tuple[int | None, str | None]:
    """(the locked directory's fd, None) or (None, what is wrong). Rank 0."""
    if run_dir.exists() and not run_dir.is_dir():
        return None, f"run.dir: {str(run_dir)!r} exists and is not a directory"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        return None, f"run.dir: cannot use {str(run_dir)!r}: {err.strerror or err}"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None, (f"run directory {run_dir} is in use by {_holder(run_dir)}; wait for "
                      "that run to end, or give this one another --run.name")
    problem = _check_writable(run_dir)
    if problem is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        return None, problem
    return fd, None


def take_lease(run_dir: Path, runtime: Runtime) -> Lease:
    """Rank 0 locks the run directory; every rank raises UsageError if it cannot."""
    fd, problem = _lock(run_dir) if runtime.is_main else (None, None)
    if dist.is_initialized():
        box = [problem]
        dist.broadcast_object_list(box, src=0)
        problem = box[0]
    if problem is not None:
        raise UsageError(problem)
    return Lease(run_dir, fd)


def _check_writable(run_dir: Path) -> str | None:
    """None if `run_dir` accepts files (and its checkpoints folder is one), else what is
    wrong."""
    checkpoints = run_dir / "checkpoints"
    if checkpoints.exists() and not checkpoints.is_dir():
        return (f"{str(checkpoints)!r} is not a directory; checkpoints are written there: "
                "move it away, or give the run another --run.name")
    try:
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".probe-"):
            pass
    except OSError as err:
        return f"run.dir: {str(run_dir)!r} is not writable: {err.strerror or err}"
    return None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def run_dir_of(config: Config, name: str) -> Path:
    """`<run.dir>/<name>`, resolved."""
    return Path(config.run.dir).expanduser().resolve() / name


def record_config(config: Config, run_dir: Path) -> None:
    """Write the resolved config beside the run's checkpoints (rank 0)."""
    _write_atomic(run_dir / "config.toml", config.to_toml())
