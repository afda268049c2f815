"""tandem's own one-node agent gives workers what torchrun's gives them, and fails alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tandem.launcher import local_agent
from tandem.errors import USAGE_EXIT_CODE

TIMEOUT_S = 120
KEYS = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE",
        "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS")

DUMP = """
import json, os, sys
keys = {keys!r}
out = os.path.join(sys.argv[1], os.environ["RANK"] + ".json")
with open(out, "w") as f:
    json.dump({{k: os.environ.get(k) for k in keys + ("MASTER_PORT", "TORCHELASTIC_RUN_ID")}}, f)
"""

# Rank 1 fails in the first attempt only; each worker that ends well leaves a file.
FLAKY = """
import os, sys
if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    sys.exit(int(sys.argv[1]))
name = "attempt{}-rank{}".format(os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"])
open(os.path.join(sys.argv[2], name), "w").close()
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in KEYS}


def _dump(tmp_path: Path, launcher: str) -> dict[str, dict]:
    script = tmp_path / "dump.py"
    script.write_text(DUMP.format(keys=KEYS))
    out = tmp_path / launcher
    out.mkdir()
    cmd = [sys.executable, "-m", "tandem.cli", "run", "--launcher", launcher,
           "--nproc-per-node", "3", "--max-restarts", "2", str(script), str(out)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def test_workers_see_what_torchrun_gives_them(tmp_path: Path) -> None:
    ours, theirs = _dump(tmp_path, "auto"), _dump(tmp_path, "torchrun")
    assert sorted(ours) == sorted(theirs) == ["0", "1", "2"]
    for rank in ours:
        assert {k: ours[rank][k] for k in KEYS} == {k: theirs[rank][k] for k in KEYS}
    # One store address and one run id for the whole group (each launcher its own).
    assert len({d["MASTER_PORT"] for d in ours.values()}) == 1
    assert len({d["TORCHELASTIC_RUN_ID"] for d in ours.values()}) == 1


def _agent(tmp_path: Path, restarts: int, code: int) -> subprocess.CompletedProcess:
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    cmd = [sys.executable, local_agent.__file__, "--nproc-per-node=2",
           f"--max-restarts={restarts}", "--", sys.executable, "-u", str(script), str(code), str(tmp_path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_a_failed_rank_restarts_the_group_while_restarts_are_left(tmp_path: Path) -> None:
    proc = _agent(tmp_path, restarts=1, code=3)
    assert proc.returncode == 0, proc.stderr
    assert "rank 1" in proc.stderr and "restarting the group (1 of 1 restarts)" in proc.stderr
    ended = {p.name for p in tmp_path.glob("attempt*")}
    assert {"attempt1-rank0", "attempt1-rank1"} <= ended and "attempt0-rank1" not in ended


def test_without_restarts_the_failure_is_the_jobs_status(tmp_path: Path) -> None:
    proc = _agent(tmp_path, restarts=0, code=3)
    assert proc.returncode == 3
    assert "rank 1 (pid" in proc.stderr and "exited with status 3" in proc.stderr
    quiet = _agent(tmp_path, restarts=0, code=USAGE_EXIT_CODE)
    assert quiet.returncode == USAGE_EXIT_CODE and "tandem:" not in quiet.stderr


def test_the_agent_does_not_import_tandem_or_torch() -> None:
    """Started by path, it must start in milliseconds: the standard library only."""
    code = (f"import runpy, sys; sys.argv = ['x', '--help']\n"
            f"try:\n    runpy.run_path({local_agent.__file__!r}, run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules and 'tandem' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert local_agent.ExitStatus.USAGE == USAGE_EXIT_CODE


def test_a_loopback_store_listens_on_the_loopback_address_only() -> None:
    """TCPStore's own server listens on every interface; a one-node group's does not."""
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    from tandem.runtime import _loopback_listener

    port = local_agent.free_port()
    extra = _loopback_listener("127.0.0.1", port, is_master=True)
    with socket.socket(fileno=os.dup(extra["master_listen_fd"])) as sock:
        assert sock.getsockname() == ("127.0.0.1", port)
    server = dist.TCPStore("127.0.0.1", port, 2, True, timedelta(seconds=10),
                           wait_for_workers=False, **extra)
    client = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=10))
    server.set("k", "v")
    assert client.get("k") == b"v"
    assert _loopback_listener("10.0.0.1", port, is_master=True) == {}
    assert _loopback_listener("127.0.0.1", port, is_master=False) == {}


def test_torchruns_agent_reports_a_failed_rank_in_the_same_words(tmp_path: Path) -> None:
    """`--launcher torchrun` (tandem.launcher.torchrun_agent) names a failed rank as tandem's agent does."""
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    cmd = [sys.executable, "-m", "tandem.cli", "run", "--launcher", "torchrun",
           "--nproc-per-node", "2", str(script), "3", str(tmp_path)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 3, proc.stderr
    assert "tandem: rank 1 (pid" in proc.stderr
    assert "exited with status 3; its own message is above" in proc.stderr
