"""One attempt of a job on its host: run `tandem run ...`, relay stops, record the exit status.

`python -m tandem.sched.attempt ATTEMPT_DIR` (or `--current JOB_DIR`, which reads the
attempt directory the scheduler last named in `JOB_DIR/current`: a Slurm batch script
that is requeued runs the attempt the scheduler prepared for it) reads `spec.json` from
the attempt directory, starts the command, and writes

- `shim.json`: its own pid and host, then the launcher's pid once started;
- `exit.json`: the launcher's exit status and the time, written atomically when it ends;
- `log.txt`: the launcher's output (and so every rank's).

Every backend starts attempts through this module, so the exit status reaches the
scheduler the same way wherever the job ran (the job directory is on a file system the
scheduler sees, as the run's checkpoints must be for a resume anywhere), and the
scheduler can tell a graceful stop (75) from a failure even after its own restart. SIGTERM
and SIGINT are passed to the launcher, which turns them into a committed checkpoint.
With `stop_if_orphaned` (Ray: the actor that started it died) the attempt stops itself
gracefully when its parent goes away. Imports nothing heavy: it starts in milliseconds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SPEC_FILE = "spec.json"
SHIM_FILE = "shim.json"
EXIT_FILE = "exit.json"
LOG_FILE = "log.txt"
CURRENT_FILE = "current"
ORPHAN_POLL_S = 0.5


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON so that a reader sees the old file or the new one, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when the file is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def exit_status(code: int) -> int:
    """A shell-style exit status: 128 + N for a process killed by signal N."""
    return 128 - code if code < 0 else code


def run(attempt_dir: Path) -> int:
    """Run the attempt described in `attempt_dir/spec.json`; return the launcher's status."""
    spec = read_json(attempt_dir / SPEC_FILE)
    if spec is None:
        print(f"tandem: error: no readable {SPEC_FILE} in {attempt_dir}", file=sys.stderr)
        return 2
    shim = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    write_atomic(attempt_dir / SHIM_FILE, shim)
    env = dict(os.environ, **spec.get("env", {}))
    parent = os.getppid()
    with (attempt_dir / LOG_FILE).open("ab") as log:
        child = subprocess.Popen(spec["command"], cwd=spec.get("cwd") or None, env=env,
                                 stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
    write_atomic(attempt_dir / SHIM_FILE, {**shim, "launcher_pid": child.pid})
    relayed: list[int] = []

    def relay(signum: int, frame: object) -> None:
        relayed.append(signum)
        child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, relay)
    orphan_stop = bool(spec.get("stop_if_orphaned"))
    while True:
        try:
            code = child.wait(timeout=ORPHAN_POLL_S)
            break
        except subprocess.TimeoutExpired:
            if orphan_stop and os.getppid() != parent and not relayed:
                print("tandem: the attempt's parent is gone: stopping the job with a "
                      "checkpoint", file=sys.stderr)
                relay(signal.SIGTERM, None)
    status = exit_status(code)
    write_atomic(attempt_dir / EXIT_FILE, {"code": status, "ended": time.time(),
                                           "signals": relayed})
    return status


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m tandem.sched.attempt ATTEMPT_DIR | --current JOB_DIR`."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--current":
        named = (Path(args[1]) / CURRENT_FILE).read_text(encoding="utf-8").strip()
        return run(Path(args[1]) / named)
    if len(args) != 1:
        print("usage: python -m tandem.sched.attempt ATTEMPT_DIR | --current JOB_DIR",
              file=sys.stderr)
        return 2
    return run(Path(args[0]))


if __name__ == "__main__":
    raise SystemExit(main())
