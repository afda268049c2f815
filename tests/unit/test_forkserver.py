"""Warm workers: what a forked worker sees and how it ends is what a cold one's are."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import tandem
import tandem.launcher.local_agent as agent_module
from tandem.forking.wire import kill_forked
from tests.reap import kill_tree

AGENT = str(Path(agent_module.__file__).resolve())
ROOT = Path(__file__).resolve().parents[2]
WORKER = '''
import json, os, sys, time
import torch
import tandem
launch = ("TANDEM_FORKSERVER", "MASTER_PORT", "TORCHELASTIC_RUN_ID")  # new at each launch
env = {k: v for k, v in os.environ.items() if k not in launch}
out = {"public": [type(getattr(tandem, n)).__name__ for n in tandem.__all__],
       "argv": sys.argv, "orig_argv": sys.orig_argv[1:], "name": __name__,
       "file": __file__, "cwd": os.getcwd(), "path": sys.path, "env": env,
       "threads": torch.get_num_threads(), "ppid": os.getppid(), "sid": os.getsid(0)}
# One write, newline included (print writes it apart): the two workers share the pipe,
# and a single write below PIPE_BUF is not interleaved with another process's.
sys.stdout.write(json.dumps(out) + "\\n")
sys.stdout.flush()
if sys.argv[1:2] == ["hang"]:
    time.sleep(600)
'''
# How a worker ends: its status and every byte it wrote, compared warm against cold.
ENDINGS = '''
import atexit, os, pickle, signal, sys, threading, time
mode = sys.argv[1]
class Saved:
    pass
def at_exit():
    print("atexit", len(pickle.dumps(Saved())) > 0)  # __main__ is still the script's
atexit.register(at_exit)
print("a")
sys.stdout.write("partial")  # no newline, never flushed by the script
threading.Thread(target=lambda: (time.sleep(0.2), print(" thread done"))).start()
if mode == "exit3":
    sys.exit(3)
if mode == "exitmsg":
    sys.exit("bye")
if mode == "raise":
    raise ValueError("rank fails here")
if mode == "interrupt":
    raise KeyboardInterrupt
if mode == "sigterm":
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)
'''
DRIVER = '''
import json, sys
sys.path.insert(0, sys.argv[1])
from tandem.launcher.local_agent import warm_worker
command, env, result = json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
worker = warm_worker(command, env)
code = worker if isinstance(worker, str) else worker.wait()
open(result, "w").write(json.dumps({"code": code, "pid": getattr(worker, "pid", None)}))
'''


def _start_server(path: str, owner: int, *imports: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "tandem.forking.server", "--socket", path,
               "--owner", str(owner)]
    for name in imports:
        command += ["--import", name]
    proc = subprocess.Popen(command, start_new_session=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        assert proc.poll() is None and time.monotonic() < deadline, "no fork server"
        time.sleep(0.1)
    return proc


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    path = str(tmp_path_factory.mktemp("fs") / "socket")
    proc = _start_server(path, os.getpid())
    yield path, proc.pid
    proc.terminate()
    proc.wait(timeout=30)


def _agent(tmp_path: Path, nproc: int, args: list[str], socket_path: str | None,
           flags: tuple[str, ...] = ("-u",), **extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "worker.py").write_text(WORKER)
    env = dict(os.environ, MARK="m1", OMP_NUM_THREADS="1", **extra)
    env.pop(agent_module.FORKSERVER_ENV, None)
    if socket_path:
        env[agent_module.FORKSERVER_ENV] = socket_path
    return subprocess.run([sys.executable, AGENT, f"--nproc-per-node={nproc}", "--",
                           sys.executable, *flags, "worker.py", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _reports(out: str) -> list[dict]:
    return sorted((json.loads(line) for line in out.splitlines() if line.startswith("{")),
                  key=lambda r: r["env"]["RANK"])


@pytest.mark.timeout(180)
def test_a_warm_worker_sees_what_a_cold_one_sees(tmp_path: Path,
                                                 server: tuple[str, int]) -> None:
    path, server_pid = server
    # A PYTHONPATH of the job's own (a relative entry too): sys.path as a new interpreter's.
    (tmp_path / "lib").mkdir()
    pythonpath = os.pathsep.join(["lib", str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    warm = _agent(tmp_path, 2, ["ok", "x"], path, PYTHONPATH=pythonpath)
    cold = _agent(tmp_path, 2, ["ok", "x"], None, PYTHONPATH=pythonpath)
    assert warm.returncode == cold.returncode == 0, (warm.stderr, cold.stderr)
    assert "starts cold" not in warm.stderr, warm.stderr
    warm_reports, cold_reports = _reports(warm.stdout), _reports(cold.stdout)
    assert [r["ppid"] for r in warm_reports] == [server_pid, server_pid]  # forked
    assert all(r["ppid"] != server_pid for r in cold_reports)
    # Each warm worker leads a session of its own (a killpg in it reaches no other job).
    assert all(r["sid"] not in (0, os.getsid(server_pid)) for r in warm_reports)
    for report in (*warm_reports, *cold_reports):
        del report["ppid"], report["sid"]
    # argv as given (a relative script), orig_argv, __name__, __file__, cwd, sys.path,
    # the whole environment, torch's threads, tandem's public names.
    assert warm_reports == cold_reports
    # `from tandem import RunResult` first must leave `tandem.fit` the function.
    public = dict(zip(tandem.__all__, cold_reports[0]["public"], strict=True))
    assert public.pop("fit") == "function" and set(public.values()) == {"type"}


@pytest.mark.timeout(270)  # its two commands' own timeouts, and a margin
@pytest.mark.parametrize("mode", ["ok", "exit3", "exitmsg", "raise", "interrupt", "sigterm"])
def test_a_warm_worker_ends_as_a_cold_one_does(tmp_path: Path, server: tuple[str, int],
                                               mode: str) -> None:
    path, _ = server
    (tmp_path / "endings.py").write_text(ENDINGS)
    command = [sys.executable, "-u", "endings.py", mode]
    env = dict(os.environ, OMP_NUM_THREADS="1", **{agent_module.FORKSERVER_ENV: path})
    result = tmp_path / "result.json"
    with (tmp_path / "out").open("w") as out, (tmp_path / "err").open("w") as err:
        subprocess.run([sys.executable, "-c", DRIVER, str(ROOT / "src"), json.dumps(command),
                        json.dumps(env), str(result)], cwd=tmp_path, env=env, stdout=out,
                       stderr=err, timeout=120, check=True)
    warm = json.loads(result.read_text())
    assert isinstance(warm["code"], int), warm  # forked, not refused
    cold = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert warm["code"] == cold.returncode
    assert (tmp_path / "out").read_text() == cold.stdout
    assert (tmp_path / "err").read_text() == cold.stderr  # tracebacks from the script on
    expected = {"ok": 0, "exit3": 3, "exitmsg": 1, "raise": 1, "interrupt": -2,
                "sigterm": -15}
    assert cold.returncode == expected[mode]


@pytest.mark.timeout(180)
def test_a_module_run_warm_sees_what_it_sees_cold(tmp_path: Path,
                                                  server: tuple[str, int]) -> None:
    path, server_pid = server
    (tmp_path / "jobmod.py").write_text(WORKER)
    runs = []
    for socket_path in (path, None):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop(agent_module.FORKSERVER_ENV, None)
        if socket_path:
            env[agent_module.FORKSERVER_ENV] = socket_path
        runs.append(subprocess.run([sys.executable, AGENT, "--nproc-per-node=1", "--",
                                    sys.executable, "-u", "-m", "jobmod", "ok"], cwd=tmp_path,
                                   env=env, capture_output=True, text=True, timeout=120))
    (warm,), (cold,) = (_reports(r.stdout) for r in runs)
    assert warm["ppid"] == server_pid and cold["ppid"] != server_pid, runs[0].stderr
    for report in (warm, cold):
        del report["ppid"], report["sid"]
    assert warm == cold


@pytest.mark.timeout(180)
@pytest.mark.parametrize("why", ["flags", "import-time variable", "another copy"])
def test_a_worker_the_server_cannot_fork_exactly_starts_cold(
        tmp_path: Path, server: tuple[str, int], why: str) -> None:
    path, server_pid = server
    if why == "flags":
        done = _agent(tmp_path, 1, ["ok"], path, flags=("-X", "dev"))
        said = "interpreter options other than -u"
    elif why == "import-time variable":  # two ranks: one line, both cold
        done = _agent(tmp_path, 2, ["ok"], path, TORCH_LOGS="+dynamo")
        said = "TORCH_LOGS differs from the fork server's"
    else:  # another tandem, first on the path
        (tmp_path / "other" / "tandem").mkdir(parents=True)
        (tmp_path / "other" / "tandem" / "__init__.py").write_text("__all__ = []\n")
        done = _agent(tmp_path, 1, ["ok"], path, PYTHONPATH=str(tmp_path / "other"))
        said = f"PYTHONPATH entry {tmp_path / 'other'} holds tandem"
    assert done.returncode == 0, done.stderr
    assert f"rank 0 starts cold: {said}" in done.stderr, done.stderr
    assert done.stderr.count("starts cold") == 1, done.stderr
    assert all(r["ppid"] != server_pid for r in _reports(done.stdout))


@pytest.mark.timeout(180)
def test_a_killed_agent_takes_its_warm_workers_along(tmp_path: Path,
                                                     server: tuple[str, int]) -> None:
    path, server_pid = server
    (tmp_path / "worker.py").write_text(WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1", **{agent_module.FORKSERVER_ENV: path})
    agent = subprocess.Popen([sys.executable, AGENT, "--nproc-per-node=2", "--",
                              sys.executable, "-u", "worker.py", "hang"], cwd=tmp_path,
                             env=env, stdout=subprocess.PIPE, text=True)
    try:
        ranks = [json.loads(agent.stdout.readline())["env"]["RANK"] for _ in range(2)]
        workers = psutil.Process(server_pid).children()
        assert len(workers) == 2, ranks
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"workers {[p.pid for p in alive]} outlived their agent"
    finally:
        kill_tree(agent)


@pytest.mark.timeout(180)
def test_the_workers_of_one_attempt_are_killed_by_its_marker(
        tmp_path: Path, server: tuple[str, int]) -> None:
    path, server_pid = server
    (tmp_path / "worker.py").write_text(WORKER)
    agents = []
    try:
        for marker in ("store:j1/1", "store:j2/1"):
            env = dict(os.environ, OMP_NUM_THREADS="1", TANDEM_SCHED_ATTEMPT=marker,
                       **{agent_module.FORKSERVER_ENV: path})
            agent = subprocess.Popen([sys.executable, AGENT, "--nproc-per-node=1", "--",
                                      sys.executable, "-u", "worker.py", "hang"],
                                     cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
            agent.stdout.readline()
            agents.append(agent)
        before = {p.pid for p in psutil.Process(server_pid).children()}
        killed = kill_forked(path, "store:j1/1")
        assert len(killed) == 1 and set(killed) < before
        try:  # the server may have reaped it already
            psutil.wait_procs([psutil.Process(killed[0])], timeout=10)
        except psutil.NoSuchProcess:
            pass
        assert {p.pid for p in psutil.Process(server_pid).children()} == before - set(killed)
        assert agents[0].wait(timeout=10) != 0  # its agent saw the worker killed
        assert agents[1].poll() is None  # the other attempt runs on
        assert kill_forked(path, "") == []  # no marker: nothing
    finally:
        for agent in agents:
            kill_tree(agent)


@pytest.mark.timeout(180)
def test_a_changed_source_stops_the_server(tmp_path: Path) -> None:
    path = str(tmp_path / "socket")
    (tmp_path / "jobdeps").mkdir()
    module = tmp_path / "jobdeps" / "__init__.py"
    module.write_text("VALUE = 1\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tandem.forking.server", "--socket", path, "--owner",
         str(os.getpid()), "--import", "jobdeps"], start_new_session=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path),
                                                         os.environ.get("PYTHONPATH", "")])))
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(path):
            assert proc.poll() is None and time.monotonic() < deadline, "no fork server"
            time.sleep(0.1)
        env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
        first = _agent(tmp_path, 1, ["ok"], path, **env)
        assert "starts cold" not in first.stderr, first.stderr
        module.write_text("VALUE = 2  # edited while the server runs\n")
        second = _agent(tmp_path, 1, ["ok"], path, **env)
        assert f"starts cold: {module} changed since the fork server imported it" \
            in second.stderr, second.stderr
        assert proc.wait(timeout=10) == 0  # stopped taking requests; no worker left
        assert not os.path.exists(path)
    finally:
        kill_tree(proc)


@pytest.mark.timeout(120)
def test_the_server_outlives_its_owner_only_while_its_workers_run(tmp_path: Path) -> None:
    path = str(tmp_path / "socket")
    (tmp_path / "worker.py").write_text(WORKER)
    # The owner: a process that starts the server, then waits to be told to exit.
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, os\n"
         f"p = subprocess.Popen([sys.executable, '-m', 'tandem.forking.server', '--socket', "
         f"{path!r}, '--owner', str(os.getpid())], start_new_session=True)\n"
         "print(p.pid, flush=True)\nsys.stdin.readline()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    server = psutil.Process(int(owner.stdout.readline()))
    agent = None
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(path):
            assert time.monotonic() < deadline, "no fork server"
            time.sleep(0.1)
        env = dict(os.environ, OMP_NUM_THREADS="1", **{agent_module.FORKSERVER_ENV: path})
        agent = subprocess.Popen([sys.executable, AGENT, "--nproc-per-node=1", "--",
                                  sys.executable, "-u", "worker.py", "hang"], cwd=tmp_path,
                                 env=env, stdout=subprocess.PIPE, text=True)
        assert json.loads(agent.stdout.readline())["ppid"] == server.pid
        owner.stdin.write("\n")
        owner.stdin.flush()
        owner.wait(timeout=10)
        deadline = time.monotonic() + 10
        while os.path.exists(path):  # no new requests once the owner is gone
            assert time.monotonic() < deadline, "the server still listens"
            time.sleep(0.05)
        assert server.is_running(), "the server left before its worker"
        agent.send_signal(signal.SIGTERM)  # the worker ends: then the server does
        assert agent.wait(timeout=30) == 128 + signal.SIGTERM
        server.wait(timeout=10)
    finally:
        if agent is not None:
            kill_tree(agent)
        if server.is_running():
            server.kill()
        kill_tree(owner)


@pytest.mark.parametrize("name", ["libcuda.so.1", "libamdhip64.so.6"])
def test_a_process_that_loaded_a_gpu_driver_is_seen(tmp_path: Path, name: str) -> None:
    # A file named as the driver, mapped as a loaded library would be: what the check reads.
    driver = tmp_path / name
    driver.write_bytes(b"\0" * 4096)
    probe = ("import mmap, sys\n"
             "from tandem.forking.server import cuda_loaded\n"
             "before = cuda_loaded()\n"
             "f = open(sys.argv[1], 'rb')\n"
             "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
             "print(before, cuda_loaded())\n")
    done = subprocess.run([sys.executable, "-c", probe, str(driver)], capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.split() == ["False", "True"], done.stderr
