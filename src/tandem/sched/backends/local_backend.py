"""The local backend: attempts are `tandem run` process groups on this machine.

Slots are this machine's GPUs (each attempt sees only its own through
CUDA_VISIBLE_DEVICES), else its CPU cores. An attempt is started in a session of its
own (`start_new_session`), so it outlives the service: a restarted service finds it
again by pid (checked against the process's start time, so a recycled pid is not taken
for it) and by the marker every process of the attempt carries in its environment.

Workers start warm: the backend runs a fork server (`tandem/forking/server.py`) that has
imported torch and tandem once, and every attempt's agent forks its workers from it,
which takes those imports out of each start, restart and resize
(`benchmarks/launch_startup.py`). A worker the server cannot fork starts cold.
Forked workers do not carry the marker in their environment as the kernel shows it: a
kill asks the server for the attempt's workers, and they die with their agent anyway.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from tandem.forking.wire import FORKSERVER_ENV, kill_forked
from tandem.sched.backends.backend import (
    ATTEMPT_ENV,
    LaunchPlan,
    kill_marked,
    marked_processes,
    shim_command,
)
from tandem.sched.policies.cluster import Cluster
from tandem.sched.service.attempt import SHIM_FILE, read_json

log = logging.getLogger("tandem")


def gpu_count() -> int:
    """GPUs `nvidia-smi` lists on this machine (0 without the tool or a GPU)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                              timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))


class LocalBackend:
    """Attempts as process groups on this machine, one slot per GPU or CPU core."""

    name = "local"

    def __init__(self, slots: int | None = None, warm: bool = True,
                 warm_imports: Sequence[str] = ()) -> None:
        self.gpus = gpu_count()
        found = self.gpus or os.cpu_count() or 1
        if slots is not None and slots < 1:
            raise ValueError(f"--slots: {slots} is not allowed; need >= 1")
        self.slots = slots or found
        self.host = socket.gethostname()
        self._children: dict[int, subprocess.Popen] = {}
        self._taken: dict[str, list[int]] = {}  # attempt marker -> GPU indices
        self.warm_imports = list(warm_imports)
        self.forkserver: ForkServer | None = ForkServer(self.warm_imports) if warm else None
        self._retired: list[ForkServer] = []  # servers that stopped taking requests

    def _forkserver(self) -> ForkServer | None:
        """The fork server to start workers from, if one listens; a server that stopped
        listening (its sources changed, or it died) is replaced by a new one."""
        server = self.forkserver
        if server is None:
            return None
        if server.ready():
            return server
        if server.gone():
            log.warning("fork server (pid %d) stopped taking requests; starting another",
                        server.process.pid)
            self._retired.append(server)
            self.forkserver = ForkServer(self.warm_imports)
        return None

    def cluster(self) -> Cluster:
        """One node with `slots` slots."""
        return Cluster(nodes=1, slots_per_node=self.slots)

    def adopt(self, handle: Mapping[str, Any]) -> None:
        """Count the GPUs of an attempt found running after a restart as taken."""
        if handle.get("gpus") is not None and handle.get("marker"):
            self._taken[str(handle["marker"])] = list(handle["gpus"])

    def _gpus_for(self, plan: LaunchPlan) -> list[int] | None:
        if not self.gpus:
            return None
        busy = {g for gpus in self._taken.values() for g in gpus}
        free = [g for g in range(self.gpus) if g not in busy]
        if len(free) < plan.procs:
            raise RuntimeError(f"{plan.procs} GPUs wanted for {plan.job.job_id}, "
                               f"{len(free)} free; the service counts slots wrongly")
        return free[:plan.procs]

    def launch(self, plan: LaunchPlan, spec: dict[str, Any]) -> dict[str, Any]:
        """Start the attempt's shim in a new session, its output into the attempt's log."""
        gpus = self._gpus_for(plan)
        env = dict(os.environ, **spec["env"])
        server = self._forkserver()
        if server is not None:
            env[FORKSERVER_ENV] = server.path
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
            spec["env"]["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
        with open(plan.log_path, "ab") as out:
            child = subprocess.Popen([*shim_command(), str(plan.attempt_dir)],
                                     cwd=plan.job.cwd, env=env, stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self._children[child.pid] = child
        if gpus is not None:
            self._taken[plan.marker] = gpus
        return {"host": self.host, "pid": child.pid, "started": _create_time(child.pid),
                "marker": plan.marker, "gpus": gpus}

    def find(self, marker: str, attempt_dir: Path) -> dict[str, Any] | None:
        """The handle of an attempt whose launch the service did not record: its shim,
        found by the marker its processes carry, or by the pid it wrote."""
        marked = marked_processes(marker)
        pids = {p.pid for p in marked}
        roots = [p for p in marked if p.ppid() not in pids]
        if roots:
            shim = min(roots, key=lambda p: p.create_time())
            return {"host": self.host, "pid": shim.pid, "started": shim.create_time(),
                    "marker": marker, "gpus": None}
        written = read_json(attempt_dir / SHIM_FILE)
        if written is None:
            return None
        return {"host": written.get("host"), "pid": written["pid"], "started": None,
                "marker": marker, "gpus": None}

    def _process(self, handle: Mapping[str, Any]) -> psutil.Process | None:
        """The attempt's shim if it is still this process (not a recycled pid)."""
        pid = int(handle["pid"])
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:  # reap our own zombie
            self._children.pop(pid, None)
            return None
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            started = handle.get("started")
            if started is not None and abs(proc.create_time() - float(started)) > 1.0:
                return None
            return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    def alive(self, handle: Mapping[str, Any]) -> bool:
        """Whether the shim still runs (its exit status is in its attempt directory)."""
        if handle.get("host") not in (None, self.host):
            # Started by a local service on another host sharing this store: not ours to
            # judge (its shim's heartbeat and exit status still reach the store's folder).
            return True
        return self._process(handle) is not None

    def stop(self, handle: Mapping[str, Any]) -> None:
        """SIGTERM to the shim, which passes it to the launcher (commit, exit 75)."""
        proc = self._process(handle)
        if proc is not None:
            proc.send_signal(signal.SIGTERM)

    def kill(self, handle: Mapping[str, Any]) -> None:
        """SIGKILL every process that carries the attempt's marker."""
        marker = str(handle.get("marker", ""))
        killed = kill_marked(marker) if marker else 0
        proc = self._process(handle)
        if proc is not None:
            proc.kill()
        if marker and self.forkserver is not None:
            # Warm workers do not show the marker: their server knows them (and kills
            # them in any case once their agent is gone).
            forked = kill_forked(self.forkserver.path, marker)
            psutil.wait_procs([p for p in map(_existing, forked) if p is not None],
                              timeout=10)
            killed += len(forked)
        log.warning("killed %d processes of attempt %s", killed, marker)

    def release(self, handle: Mapping[str, Any]) -> None:
        """Forget the attempt's GPUs and reap its shim."""
        self._taken.pop(str(handle.get("marker", "")), None)
        child = self._children.pop(int(handle.get("pid", -1)), None)
        if child is not None:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._children[child.pid] = child

    def close(self) -> None:
        """Stop the fork server taking requests; attempts keep running in their own
        sessions (the server exits after the last worker it forked)."""
        for server in (self.forkserver, *self._retired):
            if server is not None:
                server.close()


FOLDER_PREFIX = "tandem-forkserver-"
PID_FILE = "pid"  # the server's pid, written once it is started
UNCLAIMED_S = 600.0  # a folder that never got a pid file is stale after this long


def reap_stale_folders(parent: str | None = None) -> list[str]:
    """Remove the fork-server folders (this user's, in `parent`, by default the temp
    folder) whose server is gone; returns them.

    A server removes its own folder as it exits, but one killed by SIGKILL (with its
    scheduler, say) cannot: the next scheduler on this machine removes what it left."""
    parent = parent or tempfile.gettempdir()
    removed = []
    try:
        names = [n for n in os.listdir(parent) if n.startswith(FOLDER_PREFIX)]
    except OSError:
        return removed
    for name in names:
        folder = os.path.join(parent, name)
        try:
            info = os.stat(folder)
            if info.st_uid != os.getuid():
                continue
            pid = int(Path(folder, PID_FILE).read_text(encoding="utf-8") or 0)
        except FileNotFoundError:
            pid = 0 if time.time() - info.st_mtime > UNCLAIMED_S else -1
        except (OSError, ValueError):
            continue
        if pid < 0 or (pid and _serves_from(pid, folder)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _serves_from(pid: int, folder: str) -> bool:
    """Whether `pid` is a live fork server of `folder` (not a recycled pid)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and folder in " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class ForkServer:
    """The backend's fork server: started at once, used once it listens. Its own lines
    (the imports' time, a module it could not import) go to the scheduler's log."""

    def __init__(self, imports: Sequence[str] = ()) -> None:
        for folder in reap_stale_folders():
            log.info("removed %s, left by a fork server that is gone", folder)
        self.folder = tempfile.mkdtemp(prefix=FOLDER_PREFIX)  # mode 0700
        self.path = os.path.join(self.folder, "socket")
        self.log_path = os.path.join(self.folder, "log.txt")
        command = [sys.executable, "-m", "tandem.forking.server", "--socket", self.path,
                   "--owner", str(os.getpid()), "--folder", self.folder]
        for name in imports:
            command += ["--import", name]
        self.started = time.monotonic()
        with open(self.log_path, "ab") as out:
            # Its own file, not the scheduler's streams: it may outlive the scheduler.
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        Path(self.folder, PID_FILE).write_text(str(self.process.pid), encoding="utf-8")
        self._ready = False
        self._relayed = 0

    def _relay(self) -> None:
        try:
            with open(self.log_path, "rb") as src:
                src.seek(self._relayed)
                data = src.read()
        except OSError:
            return
        lines = data.rsplit(b"\n", 1)[0] if b"\n" in data else b""
        self._relayed += len(lines) + (1 if lines else 0)
        for line in lines.decode(errors="replace").splitlines():
            log.info("%s", line)

    def ready(self) -> bool:
        """Whether the server listens (it does once its imports are done)."""
        self._relay()
        if not self._ready and self.process.poll() is None and os.path.exists(self.path):
            self._ready = True
            log.info("fork server (pid %d) listening; first used %.1f s after its start",
                     self.process.pid, time.monotonic() - self.started)
        return self._ready and self.process.poll() is None and os.path.exists(self.path)

    def gone(self) -> bool:
        """Whether the server has stopped taking requests (or never will)."""
        return self.process.poll() is not None or (self._ready and not os.path.exists(self.path))

    def close(self) -> None:
        self._relay()
        if self.process.poll() is None:
            self.process.terminate()
        shutil.rmtree(self.folder, ignore_errors=True)


def _existing(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


__all__ = ["ATTEMPT_ENV", "LocalBackend", "gpu_count"]
