"""One node's workers, started and watched without torchrun's agent.

`tandem run` on one node starts this file by path (`python .../local_agent.py ...`): it
imports nothing but the standard library (and the fork server's protocol from
`tandem/forking/wire.py`, which imports nothing else), so the workers start about as
soon as the command does. torchrun's agent imports torch before it starts any worker, a
serial cost paid at every start, restart and resize of a job (`benchmarks/launch_startup.py`
measures it); on one node its rendezvous has nothing to agree on, so this agent does without it.

What the workers see is what torchrun gives them: RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, ROLE_NAME, GROUP_WORLD_SIZE, ROLE_WORLD_SIZE,
MASTER_ADDR (127.0.0.1) and MASTER_PORT (a free port; rank 0 serves the store there),
TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID and
TORCHELASTIC_USE_AGENT_STORE=False, each worker `python -u SCRIPT ARGS`. What it does is
what torchrun's agent does on one node:

- all workers exit 0: exit 0;
- a worker fails: the others get SIGTERM (SIGKILL 30 s later); with restarts left the
  group starts again (TORCHELASTIC_RESTART_COUNT one higher, a new port), else the agent
  exits with the worker's status, naming the rank in one line (a usage error, status 2,
  exits quietly: the worker's own one-line message says it all);
- SIGTERM, SIGINT, SIGHUP or SIGQUIT: passed to every worker once; the agent waits for
  them (SIGKILL after 30 s) and exits 128 + the signal's number.

With TANDEM_FORKSERVER set to a fork server's socket (the scheduler's local backend sets
it; see `tandem/forking/server.py`), each worker is forked from that server, which has
imported torch already, instead of started as a new interpreter; where the server is
not there or cannot fork this worker the worker starts cold, and the agent says why in
one line.
"""

from __future__ import annotations

import argparse
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
import uuid


def _sibling(name: str):  # noqa: ANN202 - a module
    """A module of this `tandem` (`name` is its path under the package, without `.py`),
    loaded from its file: a job's PYTHONPATH, which this agent inherits, may hold another
    `tandem` (or none)."""
    from importlib import util

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = util.spec_from_file_location(f"_tandem_{name.replace('/', '_')}",
                                        os.path.join(package, f"{name}.py"))
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_wire = _sibling("forking/wire")
FORKSERVER_ENV, read_message, send_message = (_wire.FORKSERVER_ENV, _wire.read_message,
                                              _wire.send_message)

ExitStatus = _sibling("status").ExitStatus
STOP_TIMEOUT_S = 30.0  # torchrun's own grace before SIGKILL
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
HOST = "127.0.0.1"
# Below Linux's ephemeral range (32768-60999): no outgoing connection takes the port
# between the moment it is found free and the moment rank 0 binds it.
PORT_RANGE = (20000, 32000)


def free_port() -> int:
    """A port on the loopback interface that nothing listens on now."""
    for _ in range(50):
        port = random.randrange(*PORT_RANGE)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def worker_env(rank: int, nproc: int, port: int, restart: int, max_restarts: int,
               run_id: str) -> dict[str, str]:
    """The environment torchrun gives worker `rank` of a one-node group."""
    env = dict(os.environ)
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
        "ROLE_RANK": str(rank), "ROLE_NAME": "default",
        "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(nproc),
        "MASTER_ADDR": HOST, "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": str(restart),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "False",
    })
    if nproc > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


LOST_STATUS = 1  # a warm worker whose exit status went with its fork server


class WarmWorker:
    """A worker forked by the fork server, watched like a `subprocess.Popen`.

    Its exit status comes over the connection. If the connection closes without one,
    the server went away: its workers got SIGTERM from the kernel (a committed
    checkpoint); this one counts as failed (status 1) once it has gone, and is killed
    if it has not within 30 s.
    """

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid
        self.returncode: int | None = None
        self.lost_at: float | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.lost_at is not None:
            self._outlived()
        elif self.returncode is None and select.select([self.sock], [], [], 0)[0]:
            self._read()
        return self.returncode

    def _outlived(self) -> None:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            self.returncode = LOST_STATUS
            return
        if time.monotonic() - self.lost_at > STOP_TIMEOUT_S:
            os.kill(self.pid, signal.SIGKILL)
            self.returncode = -signal.SIGKILL

    def _read(self) -> None:
        """The connection is readable: the exit status (sent whole), or its end."""
        try:
            self.returncode = int(read_message(self.sock)["exit"])
        except (OSError, ValueError, KeyError):
            self._lost()
            return
        self.sock.close()

    def _lost(self) -> None:
        self.sock.close()
        self.lost_at = time.monotonic()
        sys.stderr.write(f"tandem: the fork server of worker pid {self.pid} went away; "
                         "its exit status goes with it\n")
        self._outlived()

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        while self.poll() is None:
            if self.lost_at is None:
                select.select([self.sock], [], [], 1.0)
            else:
                time.sleep(0.1)
        return self.returncode


def warm_worker(command: list[str], env: dict[str, str]) -> WarmWorker | str:
    """The worker forked by the fork server named in the environment, or why not."""
    path = os.environ.get(FORKSERVER_ENV)
    if not path:
        return "no fork server"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(10.0)
        sock.connect(path)
        send_message(sock, {"argv": command, "env": env, "cwd": os.getcwd()}, [0, 1, 2])
        reply = read_message(sock)
    except (OSError, ValueError) as err:
        sock.close()
        return f"fork server {path}: {err}"
    if "pid" not in reply:
        sock.close()
        return str(reply.get("error", reply))
    sock.settimeout(None)
    return WarmWorker(sock, int(reply["pid"]))


def start_worker(command: list[str], env: dict[str, str],
                 warm: bool = True) -> subprocess.Popen | WarmWorker:
    """A worker running `command`: forked warm where a fork server can (and `warm`),
    else cold (the reason in a line on stderr)."""
    if warm and os.environ.get(FORKSERVER_ENV):
        forked = warm_worker(command, env)
        if isinstance(forked, WarmWorker):
            return forked
        sys.stderr.write(f"tandem: rank {env['RANK']} starts cold: {forked}\n")
    return subprocess.Popen(command, env=env)


class Group:
    """One attempt's workers."""

    def __init__(self, command: list[str], nproc: int, restart: int, max_restarts: int,
                 run_id: str) -> None:
        port = free_port()
        self.procs: list[subprocess.Popen | WarmWorker] = []
        warm = True
        for rank in range(nproc):
            proc = start_worker(command, worker_env(rank, nproc, port, restart,
                                                    max_restarts, run_id), warm)
            warm = warm and isinstance(proc, WarmWorker)  # once refused, the rest go cold
            self.procs.append(proc)

    def failed(self) -> tuple[int, subprocess.Popen] | None:
        """The lowest rank that exited with a non-zero status, if any."""
        for rank, proc in enumerate(self.procs):
            if proc.poll() not in (None, 0):
                return rank, proc
        return None

    def done(self) -> bool:
        return all(proc.poll() is not None for proc in self.procs)

    def signal(self, signum: int) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signum)
                except ProcessLookupError:
                    pass

    def wait_or_kill(self, interval: float) -> None:
        """Wait for every worker to exit; SIGKILL those left after 30 s."""
        end = time.monotonic() + STOP_TIMEOUT_S
        while not self.done() and time.monotonic() < end:
            time.sleep(interval)
        self.signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait()


def describe(rank: int, pid: int, code: int) -> str:
    """How a worker ended, in the words of both agents' one-line failure report."""
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    return f"rank {rank} (pid {pid}) {how}"


def run(command: list[str], nproc: int, max_restarts: int, interval: float) -> int:
    """Run the group (restarting it up to `max_restarts` times); return the job's status."""
    received: list[int] = []
    delivered: list[Group] = []  # groups the first signal was passed to
    group: Group | None = None

    def deliver() -> None:
        if received and group is not None and group not in delivered:
            delivered.append(group)
            group.signal(received[0])

    def on_signal(signum: int, frame: object) -> None:
        received.append(signum)
        deliver()

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or str(uuid.uuid4())
    restart = 0
    while True:
        group = Group(command, nproc, restart, max_restarts, run_id)
        deliver()  # a signal that came while the workers were being started
        while not received and not group.done() and group.failed() is None:
            time.sleep(interval)
        if received:
            deliver()
            group.wait_or_kill(interval)
            return 128 + received[0]
        failure = group.failed()
        if failure is None:
            return 0
        rank, proc = failure
        group.signal(signal.SIGTERM)
        group.wait_or_kill(interval)
        code = proc.returncode
        if restart < max_restarts and not received:
            restart += 1
            sys.stderr.write(f"tandem: {describe(rank, proc.pid, code)}; restarting the group "
                             f"({restart} of {max_restarts} restarts)\n")
            continue
        if code != ExitStatus.USAGE:
            sys.stderr.write(f"tandem: {describe(rank, proc.pid, code)}; its own message "
                             "is above\n")
        return code if code > 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem-local-agent")
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--monitor-interval", type=float, default=0.1)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="what each worker runs, after `--`")
    ns = parser.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if ns.nproc_per_node < 1 or not command:
        parser.error("need --nproc-per-node >= 1 and a command after --")
    return run(command, ns.nproc_per_node, ns.max_restarts, ns.monitor_interval)


if __name__ == "__main__":
    raise SystemExit(main())
