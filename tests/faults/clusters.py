"""Real engines for the scheduler's backend tests: a local Ray head, a one-node Slurm.

Each is started by the test and stopped after it, pass or fail: every process it starts
carries a marker of its own in the environment, and exactly those processes are ended
(never `ray stop`, which would end every Ray process on the machine). Where an engine
cannot start here, the test is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from tests.dist.procs import free_port

MARK_ENV = "TANDEM_TEST_ENGINE"


def end_marked(mark: str, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, every process carrying MARK_ENV=mark."""
    procs = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(MARK_ENV) == mark:
                procs.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=grace)


@contextmanager
def ray_head(cpus: int = 2) -> Iterator[str]:
    """A Ray head on this machine with `cpus` CPUs; yields its address."""
    ray_cli = Path(sys.executable).parent / "ray"
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.skip("ray is not installed (pip install -e '.[ray]')")
    mark = uuid.uuid4().hex
    # Short: Ray's unix sockets live under it, and their paths are limited to 107 bytes.
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    port = free_port()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", **{MARK_ENV: mark})
    try:
        done = subprocess.run(
            [str(ray_cli), "start", "--head", "--node-ip-address", "127.0.0.1",
             "--port", str(port), "--num-cpus", str(cpus), "--include-dashboard", "false",
             "--disable-usage-stats", "--temp-dir", temp],
            env=env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            pytest.skip(f"a Ray head cannot start here: {done.stderr.strip()[-400:]}")
        yield f"127.0.0.1:{port}"
    finally:
        end_marked(mark)
        shutil.rmtree(temp, ignore_errors=True)


SLURM_CONF = """ClusterName=tandemtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge.socket
CredType=cred/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=30
MinJobAge=3600
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@contextmanager
def slurm_node(cpus: int = 2) -> Iterator[dict[str, str]]:
    """munged, slurmctld and slurmd for this host with `cpus` CPUs; yields the environment
    (SLURM_CONF) in which Slurm's commands reach them."""
    tools = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"Slurm is not installed (apt-get install -y slurm-wlm munge): "
                    f"missing {missing}")
    if os.geteuid() != 0:
        pytest.skip("a test Slurm needs root (slurmd runs jobs as their users)")
    key = Path("/etc/munge/munge.key")
    if not key.is_file():
        pytest.skip(f"munge has no key at {key} (the munge package makes one)")
    mark = uuid.uuid4().hex
    folder = Path(tempfile.mkdtemp(prefix="sl", dir="/tmp"))
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    conf = folder / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=socket.gethostname().split(".")[0],
                                      ctld_port=free_port(), d_port=free_port(),
                                      dir=folder, cpus=cpus))
    env = dict(os.environ, SLURM_CONF=str(conf), **{MARK_ENV: mark})
    try:
        _start(["munged", f"--socket={folder}/munge.socket", f"--key-file={key}",
                f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log",
                f"--seed-file={folder}/munge.seed", "--force"], env, folder)
        _start(["slurmctld", "-f", str(conf)], env, folder)
        _start(["slurmd", "-f", str(conf)], env, folder)
        _wait_idle(env, folder)
        yield {"SLURM_CONF": str(conf)}
    finally:
        subprocess.run(["scancel", "--full", "--quiet", "--user=root"], env=env,
                       capture_output=True, timeout=30, check=False)
        end_marked(mark)
        shutil.rmtree(folder, ignore_errors=True)


def _start(cmd: list[str], env: dict[str, str], folder: Path) -> None:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"{cmd[0]} cannot start here: {done.stderr.strip()[-300:]} "
                    f"{_logs(folder)}")


def _wait_idle(env: dict[str, str], folder: Path, timeout: float = 45.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                              text=True, timeout=30)
        if done.returncode == 0 and done.stdout.strip() == "idle":
            return
        time.sleep(0.5)
    pytest.skip(f"the test Slurm node did not become idle within {timeout:.0f} s: "
                f"{_logs(folder)}")


def _logs(folder: Path) -> str:
    tails = []
    for name in ("slurmctld.log", "slurmd.log", "munged.log"):
        path = folder / name
        if path.is_file():
            tails.append(f"{name}: {path.read_text(errors='replace')[-300:]}")
    return " | ".join(tails)
