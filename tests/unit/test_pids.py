"""A process is alive until it exits; a zombie (exited, not yet reaped) is not."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tandem.pids import alive


def test_running_exited_and_unreaped_processes() -> None:
    assert alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert alive(child.pid)
        child.kill()
        deadline = time.monotonic() + 10
        while alive(child.pid) and time.monotonic() < deadline:  # a zombie until reaped
            time.sleep(0.01)
        assert not alive(child.pid), "a killed, unreaped child must not count as alive"
    finally:
        child.wait(10)
    assert not alive(child.pid)  # reaped: gone
