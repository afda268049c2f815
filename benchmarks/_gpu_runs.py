"""GPU checks through whole tandem runs: memory figures, MFU, host syncs, compile, char-LM."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from _bench import CHAR_LM, child_env, tandem_command
from _gpu_common import (
    Row,
    captured_tandem_log,
    ends,
    failed_reasons,
    finite,
    fit_here,
    mlp,
    read_run,
    row,
    run_tree,
    skip,
    sync,
    tail,
    tiny_task,
    values,
)
from torch.nn import functional as F
from torch.utils.data import default_collate

import tandem
from tandem.data.loader import to_device
from tandem.monitor.flops import count_flops, peak_flops
from tandem.monitor.store import RunStore
from tandem.monitor.system import memory as memory_figures

NO_CUDA = "no CUDA device"


def _si(value: float, unit: str) -> str:
    """A number with an SI prefix: 1.23 T<unit>."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


# ---------------------------------------------------------------- memory
def _memory_allocator(device: torch.device) -> Row:
    """system.memory()'s CUDA figures around one allocation of known size."""
    what = "system.memory() CUDA figures vs torch.cuda, around a 1 GiB tensor"
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    block = torch.empty(2**28, dtype=torch.float32, device=device)  # exactly 1 GiB
    block.fill_(1.0)
    del block
    sync(device)
    figures = memory_figures(device)
    peak = figures.get("mem/cuda_peak_bytes", math.nan)
    rise = peak - base
    tests = {"peak equals max_memory_allocated": peak == torch.cuda.max_memory_allocated(device),
             "peak rose by the tensor (1 GiB .. +2 MiB)": 2**30 <= rise <= 2**30 + 2**21,
             "allocated equals memory_allocated":
                 figures.get("mem/cuda_allocated_bytes") == torch.cuda.memory_allocated(device),
             "total equals the device's memory": figures.get("mem/cuda_total_bytes")
                 == torch.cuda.get_device_properties(device).total_memory}
    figure = f"peak rose {rise / 2**20:.1f} MiB for a 1024 MiB tensor; total " \
             f"{figures.get('mem/cuda_total_bytes', math.nan) / 2**30:.1f} GiB"
    return row("memory_figures", what, figure, all(tests.values()), failed_reasons(tests))


def _memory_in_store(device: torch.device, work: Path) -> Row:
    """What a tandem.fit run records of memory, against the allocator's own peak."""
    what = "a fit run records mem/cuda_peak_bytes (<= the allocator's peak)"
    cuda = device.type == "cuda"
    if cuda:
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
    _, record = fit_here(tiny_task(), work, "memory", {
        "train.steps": 20, "train.global_batch": 64, "monitor.log_every": 10})
    names = record["metric_names"]
    if not cuda:
        tests = {"the run recorded mem/rss_bytes": "mem/rss_bytes" in names}
        return row("memory_store", what, "mem/* recorded: " + ", ".join(
            n for n in names if n.startswith("mem/")), all(tests.values()),
            failed_reasons(tests))
    with RunStore(work / "runs" / "tandem.db") as store:
        recorded = [m["value"] for m in store.metrics(record["run_id"], "mem/cuda_peak_bytes")]
    peak = torch.cuda.max_memory_allocated(device)
    tests = {"the run recorded mem/cuda_peak_bytes": bool(recorded),
             "recorded peak <= allocator peak": bool(recorded) and max(recorded) <= peak,
             "recorded peak > 0": bool(recorded) and min(recorded) > 0}
    mem_names = [n for n in names if n.startswith("mem/")]
    figure = (f"recorded {max(recorded) / 2**20:.1f} MiB vs allocator {peak / 2**20:.1f} MiB"
              if recorded else f"recorded mem/* names: {', '.join(mem_names) or 'none'}")
    return row("memory_store", what, figure, all(tests.values()), failed_reasons(tests))


def memory(device: torch.device, work: Path, budget_s: float) -> list[Row]:
    """CUDA memory figures: the monitor's function, and what a run records."""
    rows = [_memory_in_store(device, work)]
    if device.type == "cuda":
        rows.append(_memory_allocator(device))
    else:
        rows.append(skip("memory_figures", "system.memory() CUDA figures vs torch.cuda",
                         NO_CUDA))
    return rows


# ---------------------------------------------------------------- MFU
def _analytic_flops(rows: int, din: int, width: int, layers: int) -> float:
    """Matmul FLOPs of one forward+backward of the MLP below: every Linear costs 2*rows*in*out
    forward, as much for its weight gradient, and as much for its input gradient except
    the first layer (its input needs none)."""
    pairs = [(din, width), *[(width, width)] * layers, (width, din)]
    forward = sum(2 * rows * i * o for i, o in pairs)
    return 2 * forward + forward - 2 * rows * din * width


def mfu(device: torch.device, work: Path, budget_s: float) -> list[Row]:
    """MFU of a matmul-heavy step against the peak tandem picks, FLOPs against analysis."""
    what = "MFU of a matmul-heavy MLP step vs the data-sheet peak; FLOPs vs analytic"
    cuda = device.type == "cuda"
    din, width, layers, tokens, micro, mode = ((256, 8192, 4, 64, 64, "bf16") if cuda
                                               else (64, 256, 2, 16, 16, "fp32"))

    def data() -> torch.utils.data.Dataset:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(4 * micro, tokens, din, generator=generator)
        return torch.utils.data.TensorDataset(x, torch.randn(x.shape, generator=generator))

    task = tandem.Task(model=lambda: mlp([din, *[width] * (layers + 1), din], seed=0),
                       optimizer=lambda params: torch.optim.SGD(params, lr=1e-4),
                       train_data=data, tokens_per_sample=tokens,
                       loss=lambda out, batch: F.mse_loss(out.float(), batch[1]))
    _, record = fit_here(task, work, "mfu", {
        "train.steps": 40 if cuda else 30, "train.global_batch": micro,
        "monitor.log_every": 10, "monitor.calibrate_at": 10, "precision.mode": mode})
    counted = (values(record, "flops/per_rank_step") or [math.nan])[-1]
    analytic = _analytic_flops(micro * tokens, din, width, layers)
    mfus = values(record, "mfu")
    peak, source = peak_flops(device, mode)
    steady = statistics.median(mfus) if mfus else math.nan
    tests = {"count_flops within 1% of the analytic count": abs(counted / analytic - 1) <= 0.01,
             "0 < MFU < 1 in every window": bool(mfus) and all(0 < m < 1 for m in mfus)}
    if cuda:
        tests["peak from the data sheet"] = source.startswith("data sheet")
    figure = (f"MFU {steady:.1%} of {_si(peak, 'FLOP/s')} ({source}); "
              f"{_si(counted, 'FLOP')}/step (analytic {_si(analytic, 'FLOP')})")
    return [row("mfu", what, figure, all(tests.values()), failed_reasons(tests), mfu=mfus,
                peak=peak, source=source, counted=counted, analytic=analytic)]


# ---------------------------------------------------------------- host syncs
# Implicit syncs a step may make (beyond the window closes, ~0.3 a step at log_every 10):
# fp32/bf16, the non-finite guard's branch on the gradient norm (trainer/step.py);
# fp16, GradScaler.step's own found-inf check, and the loss-scale read in the step.
SYNC_ALLOWANCE = {"fp32": 1.5, "fp16": 2.5}


def _count_syncs(work: Callable[[], object], cuda: bool) -> int:
    """Implicit host-device syncs torch's sync debug mode reports while `work` runs."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            work()
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def _syncs(mode: str, steps: int, work: Path, cuda: bool) -> int:
    """Implicit syncs of a whole fit run of `steps` steps in `mode`."""
    return _count_syncs(lambda: fit_here(tiny_task(), work, f"syncs_{mode}_{steps}", {
        "train.steps": steps, "train.global_batch": 64, "monitor.log_every": 10,
        "monitor.calibrate_at": 0, "precision.mode": mode}), cuda)


def host_syncs(device: torch.device, work: Path, budget_s: float) -> list[Row]:
    """Implicit host-device synchronisations per step of tandem's loop (CUDA sync debug)."""
    cuda = device.type == "cuda"
    one = torch.ones(1, device=device)
    seen = _count_syncs(lambda: [one.item() for _ in range(5)], cuda)
    if cuda and seen != 5:  # the counter itself must see what it is meant to count
        return [row("host_syncs", "implicit host syncs per step (sync debug mode)", "", False,
                    f"sync debug mode reported {seen} syncs for 5 .item() calls")]
    rows = []
    for mode, allowance in SYNC_ALLOWANCE.items():
        # Two runs: their difference is 20 steps with 2 window closes among them.
        short, long = (_syncs(mode, steps, work, cuda) for steps in (20, 40))
        per_step = (long - short) / 20
        tests = {f"at most {allowance} per step": per_step <= allowance}
        rows.append(row(f"host_syncs_{mode}", f"implicit host syncs per step, {mode} "
                        "(sync debug mode)", f"{per_step:.2f}/step ({short} in 20 steps, "
                        f"{long} in 40)", all(tests.values()), failed_reasons(tests)))
    return rows


# ---------------------------------------------------------------- compile
def load_char_lm() -> ModuleType:
    """examples/char_lm.py as a module (its task and model)."""
    spec = importlib.util.spec_from_file_location("char_lm_example", CHAR_LM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _eager_flops(task: tandem.Task, device: torch.device, micro: int) -> int:
    """FLOPs of one eager forward+backward of the task's model on a micro-batch."""
    model = task.model().to(device)
    data = task.train_data()
    batch = to_device(default_collate([data[i] for i in range(micro)]), device)
    return count_flops(lambda: task.loss(task.run_forward(model, batch), batch).backward())


def _graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far (-1 where torch does not say)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return -1
    return int(counters["stats"]["unique_graphs"])


def compile_check(device: torch.device, work: Path, budget_s: float) -> list[Row]:
    """plan.compile on the char-LM model: the probe, the compile time, a few steps."""
    what = "plan.compile: probe, compile time, char-LM trains compiled (no eval)"
    cuda = device.type == "cuda"
    from tandem.parallel.compiled import compile_problem

    start = time.perf_counter()
    problem = compile_problem(device.type)
    probe_s = time.perf_counter() - start
    if problem is not None:
        return [row("compile", what, f"probe {probe_s:.1f} s", False, f"probe: {problem}")]
    char_lm = load_char_lm()
    # No evaluation: eval mode and its batch size would compile the model a second time.
    task = dataclasses.replace(char_lm.task, eval_data=None, metrics={})
    if not cuda:
        task = dataclasses.replace(task, model=lambda: char_lm.CharLM(dim=32, layers=1, heads=2))
    steps, every = (30, 10) if cuda else (6, 3)
    graphs_before = _graphs_compiled()
    start = time.perf_counter()
    with captured_tandem_log() as messages:
        result, record = fit_here(task, work, "compiled", {
            "plan.compile": True, "train.steps": steps, "train.global_batch": 32,
            "monitor.log_every": every, "monitor.calibrate_at": every})
    wall = time.perf_counter() - start
    graphs = _graphs_compiled() - graphs_before
    losses = values(record, "loss")
    counted = (values(record, "flops/per_rank_step") or [math.nan])[-1]
    eager = _eager_flops(task, device, 32)
    first_step = (values(record, "time/step_max") or [math.nan])[0]
    steady = (values(record, "time/step") or [math.nan])[-1]
    compiled = getattr(result.model, "_compiled_call_impl", None) is not None
    fallback = [m for m in messages if "plan.compile" in m]
    tests = {"run completed": record["status"] == "completed",
             "no eager fallback": not fallback and compiled,
             "losses finite": finite(losses),
             "loss fell": len(losses) > 1 and losses[-1] < losses[0],
             "FLOPs counted on the compiled model equal eager's (MFU)": counted == eager}
    figure = (f"probe {probe_s:.1f} s; slowest step of window 1 {first_step:.1f} s, then "
              f"{steady * 1e3:.1f} ms/step; run {wall:.0f} s, {graphs} graphs compiled; loss "
              f"{ends(losses)}; "
              f"{_si(counted, 'FLOP')}/step counted (eager {_si(eager, 'FLOP')})")
    return [row("compile", what, figure, all(tests.values()),
                failed_reasons(tests) + ("; " + fallback[0] if fallback else ""),
                first_step_s=first_step, probe_s=probe_s, run_s=wall, graphs=graphs)]


# ---------------------------------------------------------------- char-LM
def char_lm(device: torch.device, work: Path, budget_s: float) -> list[Row]:
    """The char-LM example through `tandem run` at its default plan; the store read back."""
    cuda = device.type == "cuda"
    steps = 60 if cuda else 6
    what = f"char-LM example, {steps} steps via `tandem run --nproc-per-node 1`, store read back"
    flags = ["--train.steps", str(steps), "--run.dir", str(work / "runs"),
             "--run.name", "char_lm_check", "--checkpoint.at_end", "false",
             "--monitor.progress", "log"]
    if not cuda:
        flags += ["--monitor.log_every", "3", "--monitor.calibrate_at", "3",
                  "--train.eval_batch", "512"]
    log = work / "char_lm.log"
    start = time.perf_counter()
    code = run_tree(tandem_command(["--nproc-per-node", "1"], CHAR_LM, flags),
                    timeout=budget_s, env=child_env(), log=log)
    wall = time.perf_counter() - start
    if code != 0:
        why = f"ran past {budget_s:.0f} s" if code is None else f"exit {code}"
        return [row("char_lm", what, f"{wall:.0f} s", False, f"{why}: {tail(log, 600)}")]
    record = read_run(work / "runs" / "tandem.db", "char_lm_check")
    summary = record["summary"] or {}
    rates, losses = values(record, "tokens_per_s"), values(record, "loss")
    steady = rates[-1] if rates else math.nan
    tests = {"run completed": record["status"] == "completed",
             f"ran on {device.type}": str(record["env"].get("device", "")).startswith(device.type),
             "tokens/s recorded, finite and > 0": finite(rates) and min(rates) > 0,
             "loss fell": len(losses) > 1 and losses[-1] < losses[0],
             "validation bits/byte finite": finite([summary.get("bits_per_byte", math.nan)])}
    figure = (f"{steady:,.0f} tokens/s (last window; run {summary.get('tokens_per_s', 0):,.0f}); "
              f"{steps} steps, {wall:.0f} s with start-up; loss {ends(losses)}; val "
              f"{summary.get('bits_per_byte', math.nan):.2f} bits/byte")
    return [row("char_lm", what, figure, all(tests.values()), failed_reasons(tests),
                tokens_per_s=rates, device=record["env"].get("device"), summary=summary)]
