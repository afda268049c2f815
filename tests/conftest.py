"""Suite-wide guard: no process a test started outlives the suite.

Every process the tests start inherits TANDEM_TEST_SESSION. After each test module, any
such process still alive that was not running before the module began is killed
(SIGKILL reaches a stopped process too) and the module's last test is reported: tests
that leave processes behind fail instead of leaking them, whether they passed or not.
(Per module, not per test, so that a module-scoped server fixture is not counted.)

The suite runs in two lanes (pytest-xdist, `-n 2 --dist loadgroup` in pyproject.toml):
the scheduler's end-to-end tests, which mostly wait on their service's decisions and on
jobs that sleep per sample, run in one lane while everything else runs, in order, in
the other. Each lane has its own session marker, so that one lane's guard never takes
the other's processes for leftovers. The tests that measure timings run last in their
lane, after the scheduler's lane has ended.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import psutil
import pytest

SESSION_ENV = "TANDEM_TEST_SESSION"
if os.environ.get("PYTEST_XDIST_WORKER"):  # a lane: its own marker, not its parent's
    os.environ[SESSION_ENV] = f"{uuid.uuid4().hex}-{os.environ['PYTEST_XDIST_WORKER']}"
else:
    os.environ.setdefault(SESSION_ENV, uuid.uuid4().hex)
# The lane of tests that wait more than they compute (see above), and the tests that
# measure timings, which run at the end of the other lane.
WAITING_LANE = ("tests/faults/test_sched_",)
TIMING_LAST = ("tests/dist/test_evaluation_signals.py", "tests/dist/test_tune.py",
               "tests/dist/test_report_validate.py", "tests/dist/test_scaling_model_run.py")
# multiprocessing's resource tracker lives as long as the test process, by design;
# Chromium's crash handler, which the session's browser (tests/dashboard) starts at times,
# daemonized outside its process tree, as long as that browser (reaped when it closes).
LONG_LIVED = ("multiprocessing.resource_tracker", "chrome_crashpad_handler")


def session_processes(long_lived: bool = False) -> list[psutil.Process]:
    """Live processes other than this one that carry this suite's session marker (those
    named in LONG_LIVED only with `long_lived`)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if (proc.environ().get(SESSION_ENV) == os.environ[SESSION_ENV]
                    and (long_lived or not any(k in " ".join(proc.cmdline())
                                               for k in LONG_LIVED))
                    and proc.status() != psutil.STATUS_ZOMBIE):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def reap(procs: list[psutil.Process]) -> list[str]:
    """SIGKILL `procs` and wait for them; what each was, for the report."""
    named = []
    for proc in procs:
        try:
            named.append(f"{proc.pid} ({proc.status()}): {' '.join(proc.cmdline())[:160]}")
            proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    psutil.wait_procs(procs, timeout=10)
    return named


@pytest.fixture(autouse=True, scope="module")
def no_leftover_processes() -> Iterator[None]:
    """Fail a module whose tests leave any process of this suite running."""
    before = {p.pid for p in session_processes()}
    yield
    # Children get a moment to finish exiting after their parent was killed.
    deadline = time.monotonic() + 5
    left = [p for p in session_processes() if p.pid not in before]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in session_processes() if p.pid not in before]
    if left:
        named = reap(left)
        pytest.fail("processes left running by this test (now killed):\n" + "\n".join(named))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Two lanes (see the module's docstring): the waiting lane first, timing tests last."""
    def where(item: pytest.Item) -> str:
        return os.path.relpath(str(item.path), str(config.rootpath))

    def rank(item: pytest.Item) -> int:
        path = where(item)
        if path.startswith(WAITING_LANE):
            return 0
        return 2 if path.startswith(TIMING_LAST) else 1

    items.sort(key=rank)  # stable: collection order within each rank
    for item in items:
        lane = "waiting" if where(item).startswith(WAITING_LANE) else "main"
        item.add_marker(pytest.mark.xdist_group(lane))
