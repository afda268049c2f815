"""Workers that start warm: one process imports torch once, then forks each worker.

A worker that starts cold spends most of its start-up importing: `import torch`,
`torch.distributed.tensor` (which a checkpoint restore needs) and `torch._dynamo`
(imported by the first optimizer), before the job's own modules (docs/benchmarks.md,
"Start-up by launcher and warm workers", times them). Every start, restart and resize of
a scheduled job pays it again. The
scheduler's local backend runs one fork server beside it (`python -m tandem.forking.server
--socket PATH --owner PID [--import MODULE ...]`): it imports those modules, then waits
on a Unix socket in a directory only its user can open (and answers only its own user).
Asked by `tandem/launcher/local_agent.py` for a worker (the command line, the environment, the
working directory and the three standard streams, passed as file descriptors; the
protocol is `tandem/forking/wire.py`), it forks, and the child becomes the worker as a new
interpreter would (`tandem/forking/worker.py`). What a child cannot renew: the hash seed of
`str` (one per server) and the atexit functions the server's imports registered (they
run in every worker, as they would in a cold one that imported the same modules).

The server answers with the child's pid, and when the child ends, with its exit status
in `subprocess.Popen.returncode`'s terms (-N for a signal). The agent signals its workers
by pid. If the agent's connection closes while its worker runs (the agent was killed),
the server kills the worker; if the server dies, its workers get SIGTERM (a committed
checkpoint) and their agents report them failed. `wire.kill_forked(path, marker)`
kills the workers of one scheduler attempt (their environment as the kernel shows it is the
server's, so they do not carry the attempt's marker there).

A worker starts cold instead (the agent says so in one line) where a warm one could
differ from it: another interpreter (the path itself: a virtualenv's `python` links to
the base one) or interpreter flags; variables read when an interpreter starts or when
the server's modules were imported (`PYTHON*`, `LD_*`, `TORCH*`, `PYTORCH*`, `OMP_*`
but OMP_NUM_THREADS, `KMP_*`, `GOMP_*`, `MKL_*`, `OPENBLAS_*`, `MALLOC_*`, `GLIBC_*`,
`LC_*`, LANG, TZ, HOME) with other values than the server's; a PYTHONPATH that would
import another copy of a module the server holds; a server that is not single-threaded
(a fork copies only the calling thread: numpy's OpenBLAS pool is kept to one thread
here) or whose imports loaded the CUDA driver (torch's do not); or a source file of
tandem or of an `--import` changed since the server imported it (the server then stops
taking requests, and the backend starts a new one).

The server stops taking requests when its owner (the scheduler) exits or on SIGTERM,
and exits once its last worker has: attempts outlive the scheduler, as they do cold.
Given `--folder` (the private folder holding its socket and log), it removes that folder
as it exits, so that a scheduler killed by SIGKILL, which cleans up nothing, leaves
nothing behind once its attempts have ended.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import sys
import time
from typing import Any

from tandem.forking.wire import HEADER, recv_exact, send_message
from tandem.forking.worker import SIGNALS, BecomeWorker, python_path, run_worker

DEFAULT_IMPORTS = ("torch", "torch.distributed", "torch.distributed.checkpoint",
                   "torch.distributed.tensor", "torch._dynamo", "tandem.fit")
# Variables read when an interpreter starts or when the server's imports ran: a worker
# that wants other values than the server started with cannot be forked from it.
START_PREFIXES = ("PYTHON", "LD_", "TORCH", "PYTORCH", "OMP_", "KMP_", "GOMP_", "MKL_",
                  "OPENBLAS_", "MALLOC_", "GLIBC_", "LC_", "TANDEM_TUNE_")
START_NAMES = ("LANG", "LANGUAGE", "TZ", "HOME")
PER_WORKER = ("PYTHONPATH", "OMP_NUM_THREADS")  # applied after the fork
PER_WORKER_PREFIXES = ("TORCHELASTIC_",)  # read at run time, not import time
MARKER_ENV = "TANDEM_SCHED_ATTEMPT"  # tandem.sched.backends.backend.ATTEMPT_ENV
STREAMS = 3  # stdin, stdout, stderr
REAP_S = 0.05
SERVER_PATH: list[str] = []  # the server's own PYTHONPATH entries, as in sys.path
SERVER_ENV: dict[str, str] = {}  # the server's environment as it started
WATCHED: dict[str, tuple[int, int]] = {}  # source file -> (mtime_ns, size) when imported


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


def read_at_start(key: str) -> bool:
    """Whether variable `key` was read when the server started or imported."""
    if key in PER_WORKER or key.startswith(PER_WORKER_PREFIXES):
        return False
    return key.startswith(START_PREFIXES) or key in START_NAMES


def incompatibility(argv: list[str], env: dict[str, str], cwd: str) -> str | None:
    """Why a worker with this command line and environment cannot be forked from this
    process (None if it can)."""
    if not argv or os.path.abspath(argv[0]) != sys.executable:
        return f"another interpreter ({argv[:1]}, not {sys.executable})"
    rest = argv[1:]
    if rest[:1] == ["-u"]:
        rest = rest[1:]
    if not rest or (rest[0].startswith("-") and rest[0] != "-m") or rest[:1] == ["-m"] \
            and len(rest) < 2:
        return f"interpreter options other than -u ({argv[1:3]})"
    for key in sorted({*env, *SERVER_ENV}):
        if read_at_start(key) and env.get(key) != SERVER_ENV.get(key):
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


GPU_DRIVERS = ("libcuda.so", "libamdhip64.so", "libhsa-runtime64.so")  # CUDA, ROCm


def cuda_loaded() -> bool:
    """Whether this process has loaded a GPU driver (CUDA's on the first CUDA call, even
    `torch.cuda.is_available()`; ROCm's likewise); a child forked after that cannot use
    the GPU."""
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        return any(driver in line for line in maps for driver in GPU_DRIVERS)


def watch(tops: set[str]) -> None:
    """Remember the source files of the imported modules under these top-level names."""
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if where and name.split(".")[0] in tops:
            try:
                info = os.stat(where)
            except OSError:
                continue
            WATCHED[where] = (info.st_mtime_ns, info.st_size)


def changed() -> str | None:
    """A watched source file that changed since it was imported here, if any."""
    for where, (mtime, size) in WATCHED.items():
        try:
            info = os.stat(where)
        except OSError:
            return f"{where} is gone since the fork server imported it"
        if (info.st_mtime_ns, info.st_size) != (mtime, size):
            return f"{where} changed since the fork server imported it"
    return None


class Server:
    """The fork server's loop: accept requests, fork, report exits, kill orphans."""

    def __init__(self, path: str, owner: int) -> None:
        self.path = path
        self.owner = owner
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, socket.socket] = {}  # pid -> its agent's connection
        self.markers: dict[int, str] = {}  # pid -> its scheduler attempt's marker
        self.stopping = False
        self.asked_to_stop = False

    def serve(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        for sig in (signal.SIGINT, signal.SIGHUP):  # a terminal's, not the owner's
            signal.signal(sig, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # waitpid sees every exit
        tmp = f"{self.path}.{os.getpid()}"
        self.listener.bind(tmp)
        os.chmod(tmp, 0o600)
        self.listener.listen(64)
        os.rename(tmp, self.path)  # ready: a client finds the socket only once it listens
        self.selector.register(self.listener, selectors.EVENT_READ)
        while not (self.stopping and not self.children):
            if not self.stopping and (self.asked_to_stop or os.getppid() != self.owner):
                self._stop()
            for key, _ in self.selector.select(REAP_S):
                if key.fileobj is self.listener:
                    if not self.stopping:
                        self._accept()
                else:
                    self._closed(key.fileobj)
            self._reap()
        return 0

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.asked_to_stop = True

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
        try:
            conn, _ = self.listener.accept()
        except OSError as err:
            _say(f"accept failed: {err}")
            return
        fds: list[int] = []
        try:
            conn.settimeout(5.0)
            if _peer_uid(conn) != os.getuid():
                return
            head, fds, _, _ = socket.recv_fds(conn, HEADER.size, STREAMS)
            if len(head) < HEADER.size:
                head += recv_exact(conn, HEADER.size - len(head))
            request = json.loads(recv_exact(conn, HEADER.unpack(head)[0]))
            if not isinstance(request, dict):
                raise ValueError("not a JSON object")
            if "kill" in request:
                self._reply(conn, {"killed": self._kill(str(request["kill"]))})
                return
            stale = changed()
            if stale is not None:
                self._stop()  # the backend starts a new server
                self._reply(conn, {"error": stale})
                return
            why = incompatibility(list(request["argv"]), dict(request["env"]),
                                  str(request["cwd"]))
            if why is None and len(fds) != STREAMS:
                why = f"{len(fds)} file descriptors came, {STREAMS} needed"
            if why is not None:
                self._reply(conn, {"error": why})
                return
            self._fork(conn, request, fds)
            conn, fds = None, []  # the child's now
        except BecomeWorker:
            conn, fds = None, []  # the worker's now (the child closed its copy of conn)
            raise
        except Exception as err:  # noqa: BLE001 - one bad request must not end the server
            _say(f"request failed: {type(err).__name__}: {err}")
            if conn is not None:
                self._reply(conn, {"error": f"{type(err).__name__}: {err}"})
        finally:
            for fd in fds:
                os.close(fd)
            if conn is not None:
                conn.close()

    def _fork(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # nothing buffered here is written twice
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            pid = os.fork()
        except OSError:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            raise
        if pid == 0:  # the child: its handlers are the server's until it resets them
            parent = os.getppid()
            self.selector.close()
            self.listener.close()
            for other in self.children.values():
                other.close()
            conn.close()
            raise BecomeWorker(request, fds, parent, SERVER_PATH)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        self.markers[pid] = str(request["env"].get(MARKER_ENV, ""))
        self._reply(conn, {"pid": pid})
        conn.setblocking(False)
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def _kill(self, marker: str) -> list[int]:
        pids = [pid for pid, m in self.markers.items() if m == marker and marker]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

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
            self.markers.pop(pid, None)
            if conn is None or conn.fileno() < 0:
                continue
            self._reply(conn, {"exit": os.waitstatus_to_exitcode(status)})
            self.selector.unregister(conn)
            conn.close()


def _say(line: str) -> None:
    try:
        print(f"tandem forkserver: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


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


def main(argv: list[str] | None = None) -> int | None:
    parser = argparse.ArgumentParser(prog="python -m tandem.forking.server")
    parser.add_argument("--socket", required=True, help="where to listen (a new path)")
    parser.add_argument("--owner", type=int, required=True,
                        help="the process whose exit stops the server taking requests")
    parser.add_argument("--import", dest="modules", action="append", default=[],
                        help="a module to import before the first fork (repeatable; "
                             "added to the defaults)")
    parser.add_argument("--folder", default=None,
                        help="the server's own folder (its socket's), removed when it exits")
    ns = parser.parse_args(argv)
    started = time.perf_counter()
    SERVER_ENV.update(os.environ)
    SERVER_PATH[:] = python_path(os.environ.get("PYTHONPATH", ""), os.getcwd())
    # Before any import reads them: numpy's OpenBLAS starts no thread pool (a fork copies
    # only the calling thread), and torch's OpenMP default is the machine's, as in a new
    # interpreter without OMP_NUM_THREADS (a worker with it gets it after the fork).
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    os.environ.pop("OMP_NUM_THREADS", None)
    for name in (*DEFAULT_IMPORTS, *ns.modules):
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - a module that fails stays cold
            _say(f"could not import {name}: {err}")
    _public_names()
    watch({"tandem", *(name.split(".")[0] for name in ns.modules)})
    gc.collect()
    gc.freeze()  # the imports' objects stay put: a fork shares their pages
    threads = len(os.listdir("/proc/self/task"))
    _say(f"pid {os.getpid()}, imports took {time.perf_counter() - started:.2f} s, "
         f"{threads} thread(s)")
    try:
        code = Server(ns.socket, ns.owner).serve()
    except BecomeWorker as become:
        worker = become
    else:
        if ns.folder:
            shutil.rmtree(ns.folder, ignore_errors=True)
        return code
    run_worker(worker)  # outside the server's frames: its exit is the interpreter's
    return None


if __name__ == "__main__":
    raise SystemExit(main())
