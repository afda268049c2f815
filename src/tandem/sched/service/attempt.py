"""One attempt of a job on its host: run `tandem run ...`, relay stops, record the exit status.

`python -m tandem.sched.service.attempt ATTEMPT_DIR` (or `--current JOB_DIR`, which reads the
attempt directory the scheduler last named in `JOB_DIR/current`: a Slurm batch script
that is requeued runs the attempt the scheduler prepared for it) reads `spec.json` from
the attempt directory, starts the command, and writes

- `shim.json`: its own pid and host, then the launcher's pid once started; touched every
  half second while the launcher runs (a heartbeat);
- `exit.json`: the launcher's exit status and the time, written atomically when it ends;
- `log.txt`: the launcher's output (and so every rank's), and a line of its own when a
  stop arrives saying why the scheduler stops the job (`stop.json`, written by the
  scheduler before it signals: a cancel, a preemption or a resize). The launcher reads
  the same file (its path in TANDEM_SCHED_STOP_FILE) for its last line, so a cancelled
  job's log says cancelled, not preempted.

Every backend starts attempts through this module, so the exit status reaches the
scheduler the same way wherever the job ran (the job directory is on a file system the
scheduler sees, as the run's checkpoints must be for a resume anywhere), and the
scheduler can tell a graceful stop (75) from a failure even after its own restart. SIGTERM
and SIGINT are passed to the launcher, which turns them into a committed checkpoint.
With TANDEM_SCHED_GUARDIAN set to a pid (Ray: the actor that started it) the attempt
stops itself gracefully when that process goes away. Imports nothing heavy: it starts in
milliseconds.
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

from tandem.pids import alive
from tandem.status import ExitStatus

SPEC_FILE = "spec.json"
SHIM_FILE = "shim.json"
EXIT_FILE = "exit.json"
LOG_FILE = "log.txt"
CURRENT_FILE = "current"
ORPHAN_POLL_S = 0.5
GUARDIAN_ENV = "TANDEM_SCHED_GUARDIAN"
STOP_FILE = "stop.json"  # why the scheduler stops the attempt: {"reason", "to_procs"}
STOP_ENV = "TANDEM_SCHED_STOP_FILE"  # the launcher's path to it


def stop_words(stop: dict[str, Any] | None) -> str | None:
    """Why the scheduler stopped an attempt, in words; None when it was not its stop."""
    reason = (stop or {}).get("reason")
    if reason == "cancel":
        return "cancelled (tandem cancel)"
    if reason == "preempt":
        return "preempted by the scheduler (its processes went to another job)"
    if reason == "resize":
        return f"stopped by the scheduler to resize it to {stop.get('to_procs')} processes"
    return None


def _stop() -> dict[str, Any] | None:
    return read_json(Path(os.environ[STOP_ENV])) if os.environ.get(STOP_ENV) else None


def stop_reason() -> str | None:
    """In a process the scheduler stopped: its reason (cancel, preempt, resize); None
    outside the scheduler, or for a SIGTERM that was not its stop."""
    stop = _stop()
    return stop["reason"] if stop is not None and stop_words(stop) else None


def scheduler_stop() -> tuple[str, str] | None:
    """In a process the scheduler stopped: why, and what follows, in words (None outside
    the scheduler, or for a SIGTERM that was not its stop: then it is a preemption)."""
    stop = _stop()
    words = stop_words(stop)
    if words is None:
        return None
    return words, ("it will not be resumed" if stop["reason"] == "cancel"
                   else "the scheduler resumes it from there")


def launcher_line(step: int) -> str | None:
    """The launcher's last line after a graceful stop the scheduler asked for (None
    when it did not ask)."""
    said = scheduler_stop()
    if said is None:
        return None
    return f"tandem: {said[0]} at step {step}; the checkpoint is committed - {said[1]}"


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
    """Run the attempt described in `attempt_dir/spec.json`; return the launcher's status.

    A stop that arrives before the launcher started ends the attempt at once with the
    graceful status (75): nothing was trained, so nothing is lost.
    """
    relayed: list[int] = []
    child: subprocess.Popen | None = None

    def relay(signum: int, frame: object) -> None:
        if not relayed:
            _say_why(attempt_dir)
        relayed.append(signum)
        if child is not None:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, relay)
    spec = read_json(attempt_dir / SPEC_FILE)
    if spec is None:
        print(f"tandem: error: no readable {SPEC_FILE} in {attempt_dir}", file=sys.stderr)
        return 2
    shim = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    write_atomic(attempt_dir / SHIM_FILE, shim)  # from here on, a stop is relayed
    if relayed:
        return _finish(attempt_dir, ExitStatus.PREEMPTED, relayed)
    env = dict(os.environ, **spec.get("env", {}), **{STOP_ENV: str(attempt_dir / STOP_FILE)})
    guardian = int(os.environ.get(GUARDIAN_ENV) or 0)
    with (attempt_dir / LOG_FILE).open("ab") as log:
        child = subprocess.Popen(spec["command"], cwd=spec.get("cwd") or None, env=env,
                                 stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
    if relayed:  # a stop that came while the launcher was being started
        child.send_signal(relayed[-1])
    write_atomic(attempt_dir / SHIM_FILE, {**shim, "launcher_pid": child.pid})
    while True:
        try:
            code = child.wait(timeout=ORPHAN_POLL_S)
            break
        except subprocess.TimeoutExpired:
            _beat(attempt_dir)
            if guardian and not relayed and not alive(guardian):
                print(f"tandem: the attempt's guardian (pid {guardian}) is gone: stopping "
                      "the job with a checkpoint", file=sys.stderr)
                relay(signal.SIGTERM, None)
    return _finish(attempt_dir, exit_status(code), relayed)


def _say_why(attempt_dir: Path) -> None:
    """Write into the attempt's log why the scheduler stops it (nothing for another
    sender's signal: an operator's SIGTERM, a batch system's preemption)."""
    words = stop_words(read_json(attempt_dir / STOP_FILE))
    if words is None:
        return
    try:
        with (attempt_dir / LOG_FILE).open("a", encoding="utf-8") as log:
            log.write(f"tandem scheduler: {words}: stopping at the next logging window "
                      "with a checkpoint\n")
    except OSError:
        pass


def _beat(attempt_dir: Path) -> None:
    """Touch shim.json: its modification time says the attempt is alive (the scheduler
    reads it where it cannot see the process itself, e.g. while a stop runs on)."""
    try:
        os.utime(attempt_dir / SHIM_FILE)
    except OSError:
        pass


def _finish(attempt_dir: Path, status: int, relayed: list[int]) -> int:
    write_atomic(attempt_dir / EXIT_FILE, {"code": status, "ended": time.time(),
                                           "signals": relayed})
    return status


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m tandem.sched.service.attempt ATTEMPT_DIR | --current JOB_DIR`."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--current":
        named = (Path(args[1]) / CURRENT_FILE).read_text(encoding="utf-8").strip()
        attempt_dir = Path(args[1]) / named
        if (attempt_dir / EXIT_FILE).exists():
            # Restarted by the batch system itself (its own requeue) after this attempt
            # ended: nothing to run until the scheduler prepares the next one.
            print(f"tandem: {attempt_dir} has already ended; waiting for the scheduler",
                  file=sys.stderr)
            return ExitStatus.PREEMPTED
        return run(attempt_dir)
    if len(args) != 1:
        print("usage: python -m tandem.sched.service.attempt ATTEMPT_DIR | --current JOB_DIR",
              file=sys.stderr)
        return 2
    return run(Path(args[0]))


if __name__ == "__main__":
    raise SystemExit(main())
