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

import tandem.local_agent as agent_module
from tests.reap import kill_tree

AGENT = str(Path(agent_module.__file__).resolve())
ROOT = Path(__file__).resolve().parents[2]
WORKER = '''
import json, os, sys, time
import torch
import tandem
out = {"public": [type(getattr(tandem, n)).__name__ for n in tandem.__all__],
       "rank": os.environ["RANK"], "world": os.environ["WORLD_SIZE"], "argv": sys.argv,
       "name": __name__, "cwd": os.getcwd(), "path": sys.path,
       "threads": torch.get_num_threads(), "ppid": os.getppid(),
       "marker": os.environ.get("MARK")}
print(json.dumps(out), flush=True)
mode = sys.argv[1]
if mode == "fail" and os.environ["RANK"] == "1":
    raise ValueError("rank 1 fails here")
if mode == "exit":
    sys.exit(int(sys.argv[2]))
if mode == "hang":
    time.sleep(600)
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    folder = tmp_path_factory.mktemp("fs")
    path = str(folder / "socket")
    proc = subprocess.Popen([sys.executable, "-m", "tandem.forkserver", "--socket", path,
                             "--owner", str(os.getpid())], start_new_session=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        assert proc.poll() is None and time.monotonic() < deadline, "no fork server"
        time.sleep(0.1)
    yield path, proc.pid
    proc.terminate()
    proc.wait(timeout=30)


def _agent(tmp_path: Path, nproc: int, args: list[str], socket_path: str | None,
           flags: tuple[str, ...] = ("-u",), **extra: str) -> subprocess.CompletedProcess:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, MARK="m1", OMP_NUM_THREADS="1", **extra)
    env.pop(agent_module.FORKSERVER_ENV, None)
    if socket_path:
        env[agent_module.FORKSERVER_ENV] = socket_path
    return subprocess.run([sys.executable, AGENT, f"--nproc-per-node={nproc}", "--",
                           sys.executable, *flags, str(script), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _reports(out: str) -> list[dict]:
    return sorted((json.loads(line) for line in out.splitlines() if line.startswith("{")),
                  key=lambda r: r["rank"])


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
    for report in (*warm_reports, *cold_reports):
        del report["ppid"]
    assert warm_reports == cold_reports  # argv, __name__, cwd, sys.path[0], env, threads
    # `from tandem import RunResult` first must leave `tandem.fit` the function.
    assert cold_reports[0]["public"] == ["type", "type", "type", "type", "function"]


@pytest.mark.timeout(180)
def test_a_warm_worker_ends_as_a_cold_one_does(tmp_path: Path,
                                               server: tuple[str, int]) -> None:
    path, _ = server
    for args, code in ((["exit", "3"], 3), (["fail"], 1)):
        warm = _agent(tmp_path, 2, args, path)
        cold = _agent(tmp_path, 2, args, None)
        assert warm.returncode == cold.returncode == code, (warm.stderr, cold.stderr)
        if args == ["fail"]:
            # The traceback starts at the script, as the interpreter's own does.
            tail = warm.stderr[warm.stderr.index("Traceback"):]
            assert "forkserver" not in tail and "runpy" not in tail, tail
            assert "ValueError: rank 1 fails here" in tail


@pytest.mark.timeout(180)
def test_a_worker_the_server_cannot_fork_starts_cold(tmp_path: Path,
                                                     server: tuple[str, int]) -> None:
    path, server_pid = server
    done = _agent(tmp_path, 1, ["ok"], path, flags=("-X", "dev"))
    assert done.returncode == 0, done.stderr
    assert "rank 0 starts cold: interpreter options other than -u" in done.stderr
    assert _reports(done.stdout)[0]["ppid"] != server_pid


@pytest.mark.timeout(180)
def test_a_worker_that_would_import_another_copy_starts_cold(
        tmp_path: Path, server: tuple[str, int]) -> None:
    path, server_pid = server
    (tmp_path / "other" / "tandem").mkdir(parents=True)  # another tandem, first on the path
    (tmp_path / "other" / "tandem" / "__init__.py").write_text("__all__ = []\n")
    done = _agent(tmp_path, 1, ["ok"], path, PYTHONPATH=str(tmp_path / "other"))
    assert done.returncode == 0, done.stderr
    assert f"PYTHONPATH entry {tmp_path / 'other'} holds tandem" in done.stderr
    report = _reports(done.stdout)[0]
    assert report["ppid"] != server_pid and report["public"] == []


@pytest.mark.timeout(180)
def test_a_killed_agent_takes_its_warm_workers_along(tmp_path: Path,
                                                     server: tuple[str, int]) -> None:
    path, server_pid = server
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1", **{agent_module.FORKSERVER_ENV: path})
    agent = subprocess.Popen([sys.executable, AGENT, "--nproc-per-node=2", "--",
                              sys.executable, "-u", str(script), "hang"],
                             env=env, stdout=subprocess.PIPE, text=True)
    try:
        lines = [agent.stdout.readline(), agent.stdout.readline()]
        pids = [p.pid for p in psutil.Process(server_pid).children()]
        assert len(pids) == 2, (lines, pids)
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
        gone, alive = psutil.wait_procs([psutil.Process(p) for p in pids], timeout=10)
        assert not alive, f"workers {[p.pid for p in alive]} outlived their agent"
    finally:
        kill_tree(agent)


@pytest.mark.timeout(120)
def test_the_server_outlives_its_owner_only_while_its_workers_run(tmp_path: Path) -> None:
    path = str(tmp_path / "socket")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    # The owner: a shell that starts the server, then waits to be told to exit.
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, os\n"
         f"p = subprocess.Popen([sys.executable, '-m', 'tandem.forkserver', '--socket', "
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
                                  sys.executable, "-u", str(script), "hang"],
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


def test_a_process_that_loaded_the_cuda_driver_is_seen(tmp_path: Path) -> None:
    # A file named as the driver, mapped as a loaded library would be: what the check reads.
    driver = tmp_path / "libcuda.so.1"
    driver.write_bytes(b"\0" * 4096)
    probe = ("import mmap, sys\n"
             "from tandem.forkserver import cuda_loaded\n"
             "before = cuda_loaded()\n"
             "f = open(sys.argv[1], 'rb')\n"
             "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
             "print(before, cuda_loaded())\n")
    done = subprocess.run([sys.executable, "-c", probe, str(driver)], capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.split() == ["False", "True"], done.stderr
