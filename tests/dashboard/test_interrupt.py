"""Ctrl-C on `tandem dashboard`: the server stops with status 0 and no traceback."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.dashboard.conftest import get

ROOT = Path(__file__).resolve().parents[2]
TRIES = 4  # the traceback came from a race once; every try must be clean


def _start(store: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, "-m", "tandem.cli", "dashboard", "--store",
                             str(store)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    line = proc.stdout.readline()  # blocks until the URL is printed or the process ends
    if "http://" not in line:
        proc.kill()
        raise AssertionError(f"no URL printed: {line!r} {proc.communicate()[1]!r}")
    return proc, line[line.index("http://"):].strip()


def _until_served(url: str, deadline_s: float = 60) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if get(url)[0] == 200:
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{url} never answered")


@pytest.mark.timeout(300)
def test_ctrl_c_stops_the_dashboard_cleanly_every_time(store: Path) -> None:
    for attempt in range(TRIES):
        proc, url = _start(store)
        stream = None
        try:
            _until_served(url)
            if attempt % 2:  # an open event stream must not change how it stops
                parts = urlsplit(url)
                stream = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
                stream.request("GET", "/stream/runs")
                assert stream.getresponse().status == 200
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if stream is not None:
                stream.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        assert proc.returncode == 0, (attempt, proc.returncode, err)
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, (attempt, err)
