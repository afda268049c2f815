"""A scheduler killed by SIGKILL leaves no fork-server folder behind."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tandem.sched.backends.local_backend import FOLDER_PREFIX, PID_FILE
from tests.faults.sched_env import SchedEnv

SERVICE = ("--backend", "local", "--slots", "1")
DEADLINE_S = 90  # the server imports torch before it listens: minutes on a slow host


@pytest.fixture
def tmp(tmp_path: Path) -> Iterator[Path]:
    """The scheduler's TMPDIR: short, since the server's socket lives in a folder inside
    it and a Unix socket's path is at most 107 bytes (a test's tmp_path under pytest-xdist
    is longer than that once the folder and `socket` are added)."""
    folder = Path(tempfile.mkdtemp(prefix="tfs-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _folders(tmp: Path) -> list[Path]:
    return sorted(tmp.glob(f"{FOLDER_PREFIX}*"))


def _listening(env: SchedEnv, tmp: Path, other_than: Path | None = None) -> Path:
    """The fork server's folder once its socket is there."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        found = [f for f in _folders(tmp) if f != other_than and (f / "socket").exists()
                 and (f / PID_FILE).is_file()]
        if found:
            return found[0]
        assert env.service is not None and env.service.poll() is None, env.log()
        time.sleep(0.1)
    raise AssertionError(f"no fork server listened within {DEADLINE_S} s:\n{env.log()}")


def _gone(path: Path) -> bool:
    deadline = time.monotonic() + DEADLINE_S
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not path.exists()


@pytest.mark.timeout(300)
def test_a_killed_scheduler_leaves_no_fork_server_folder(tmp_path: Path, tmp: Path) -> None:
    env = SchedEnv(tmp_path, {"TMPDIR": str(tmp)})
    server = None
    try:
        env.start_service(*SERVICE)
        folder = _listening(env, tmp)
        server = psutil.Process(int((folder / PID_FILE).read_text()))
        env.kill_service()  # kill -9: the scheduler cleans nothing up itself
        assert _gone(folder), f"{folder} is still there: {list(folder.iterdir())}"
        server.wait(timeout=DEADLINE_S)  # and its server has exited
        assert _folders(tmp) == []
    finally:
        env.cleanup()
        if server is not None and server.is_running():
            server.kill()


@pytest.mark.timeout(300)
def test_the_next_scheduler_removes_a_folder_whose_server_was_killed(tmp_path: Path,
                                                                   tmp: Path) -> None:
    env = SchedEnv(tmp_path, {"TMPDIR": str(tmp)})
    try:
        env.start_service(*SERVICE)
        folder = _listening(env, tmp)
        server = psutil.Process(int((folder / PID_FILE).read_text()))
        server.send_signal(signal.SIGKILL)  # nothing of it can clean up now
        env.kill_service()
        server.wait(timeout=30)  # reaped once its parent, the scheduler, is gone
        assert folder.exists()  # what a machine-wide kill -9 leaves
        env.start_service(*SERVICE)
        fresh = _listening(env, tmp, other_than=folder)
        assert _gone(folder), f"{folder} was not removed by the next scheduler"
        assert _folders(tmp) == [fresh]
        assert os.stat(fresh).st_mode & 0o777 == 0o700
    finally:
        env.cleanup()
        for folder in _folders(tmp):
            pid = folder / PID_FILE
            if pid.is_file() and psutil.pid_exists(int(pid.read_text())):
                psutil.Process(int(pid.read_text())).kill()
