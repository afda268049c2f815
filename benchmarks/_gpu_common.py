"""Shared parts of the GPU check: result rows, device helpers, in-process tandem runs."""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import torch
from _bench import ROOT  # puts src/ on sys.path before tandem is imported
from torch import nn

import tandem
from tandem.monitor.store import RunStore

Row = dict[str, Any]


def row(check: str, what: str, figure: str, ok: bool, reason: str = "",
        **details: Any) -> Row:
    """One line of the table: what was checked, its figure, pass or fail (and why)."""
    return {"check": check, "what": what, "figure": figure,
            "status": "pass" if ok else "fail", "reason": reason, "details": details}


def skip(check: str, what: str, reason: str, figure: str = "", **details: Any) -> Row:
    """A line for a part that could not be checked here, with the reason."""
    return {"check": check, "what": what, "figure": figure, "status": "skipped",
            "reason": reason, "details": details}


def failed_reasons(tests: dict[str, bool]) -> str:
    """The names of the criteria that did not hold, joined (empty when all held)."""
    return "; ".join(name for name, held in tests.items() if not held)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (nothing on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, work: Callable[[], Any]) -> float:
    """Wall seconds of `work`, the device's queue drained before and after."""
    sync(device)
    start = time.perf_counter()
    work()
    sync(device)
    return time.perf_counter() - start


def finite(values: list[float]) -> bool:
    """True when every value is a finite number (and there is at least one)."""
    return bool(values) and all(math.isfinite(v) for v in values)


def mlp(widths: list[int], seed: int) -> nn.Module:
    """A ReLU MLP through `widths`, its weights drawn from `seed`."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (width_in, width_out) in enumerate(zip(widths, widths[1:], strict=False)):
        layers.append(nn.Linear(width_in, width_out))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    torch.random.set_rng_state(generator_state)
    return nn.Sequential(*layers)


@contextmanager
def captured_tandem_log() -> Iterator[list[str]]:
    """The messages the "tandem" logger emits inside the block."""
    import logging

    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Keep(level=logging.WARNING)
    logger = logging.getLogger("tandem")
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def fit_here(task: tandem.Task, work: Path, name: str,
             settings: dict[str, Any]) -> tuple[tandem.RunResult, dict]:
    """Run `tandem.fit` in this process; return its result and the run's record read back
    from the store: the run row (status, env, summary) and `metrics`, name -> [(step,
    value)] of the job-wide rows (rank -1)."""
    defaults = {"run.name": name, "run.dir": str(work / "runs"), "checkpoint.at_end": False,
                "monitor.progress": "log", **settings}
    result = tandem.fit(task, argv=[], defaults=defaults)
    return result, read_run(work / "runs" / "tandem.db", name)


def tiny_task(seed: int = 0) -> tandem.Task:
    """A small classification task (1024 samples of 32 features, 4 classes, an MLP)."""

    def data() -> torch.utils.data.Dataset:
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(1024, 32, generator=generator)
        return torch.utils.data.TensorDataset(x, (x[:, :4].argmax(1)))

    return tandem.Task(model=lambda: mlp([32, 256, 4], seed=seed),
                       optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
                       train_data=data,
                       loss=lambda out, batch: nn.functional.cross_entropy(out, batch[1]))


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (found before any of them dies)."""
    try:
        root = psutil.Process(pid)
        tree = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for member in tree:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(tree, timeout=10)


def run_tree(cmd: list[str], *, timeout: float, env: dict[str, str], log: Path) -> int | None:
    """Run `cmd` with its output in `log`; the exit status, or None when it ran past
    `timeout` (then it and everything it started are killed: `tandem run` starts its
    agent in a session of its own, out of reach of a plain kill)."""
    with log.open("ab") as out:
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                 cwd=ROOT)
        try:
            return child.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            kill_tree(child.pid)
            child.wait()
            return None


def tail(path: Path, chars: int = 1500) -> str:
    """The end of a text file (empty when it does not exist)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def read_run(store_path: Path, name: str) -> dict:
    """A run's row and its job-wide metric series, read back from the run store."""
    with RunStore(store_path) as store:
        record = store.run(name)
        series: dict[str, list[tuple[int, float]]] = {}
        for metric in store.metrics(record["run_id"]):
            if metric["rank"] == -1:
                series.setdefault(metric["name"], []).append((metric["step"], metric["value"]))
        record["metrics"] = series
        record["metric_names"] = store.metric_names(record["run_id"])
    return record


def ends(series: list[float], digits: int = 2) -> str:
    """'first -> last' of a series ('none' when it is empty)."""
    return f"{series[0]:.{digits}f} -> {series[-1]:.{digits}f}" if series else "none"


def values(record: dict, metric: str) -> list[float]:
    """The per-window values of a job-wide metric, in step order."""
    return [v for _, v in sorted(record["metrics"].get(metric, []))]
