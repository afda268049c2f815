"""GPU checks that run inside one process: phase timing, precision, prefetch, NVML."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _gpu_common import Row, failed_reasons, finite, mlp, row, skip, sync, timed
from torch.nn import functional as F

from tandem.config import DataConfig, PrecisionConfig
from tandem.data.loader import _cuda_prefetch, to_device, train_batches
from tandem.data.sampler import Cursor, GlobalBatchSampler
from tandem.monitor.phases import PhaseClock
from tandem.parallel.strategy import Strategy
from tandem.trainer.precision import Precision

NO_CUDA = "no CUDA device"


def _square(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Matmul operands: bf16 8192^2 on CUDA (about 1.1 TFLOP a product), small fp32 on CPU."""
    size, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (256, torch.float32)
    a = torch.randn(size, size, device=device, dtype=dtype)
    return a, torch.randn_like(a)


# ---------------------------------------------------------------- phase timing
def phase_timing(device: torch.device, work: Path, budget_s: float) -> list[Row]:
    """PhaseClock's two phases of known work against a synchronised wall clock."""
    what = "PhaseClock (CUDA events) vs synchronize+perf_counter, N and 2N matmuls"
    cuda = device.type == "cuda"
    a, b = _square(device)

    def matmuls(n: int) -> None:
        for _ in range(n):
            torch.mm(a, b)

    matmuls(3)
    one = timed(device, lambda: matmuls(5)) / 5
    n = max(4, round(0.05 / one))  # the first phase about 50 ms, the second twice that
    clock = PhaseClock(device)
    trials = []
    for _ in range(3):
        sync(device)
        start = time.perf_counter()
        clock.begin("forward", on_device=True)
        matmuls(n)
        clock.end()
        clock.begin("backward", on_device=True)
        matmuls(2 * n)
        clock.end()
        launched = time.perf_counter() - start
        sync(device)
        wall = time.perf_counter() - start
        phases = clock.collect()
        trials.append((phases["forward"], phases["backward"], wall, launched))
    # Medians over the trials, each figure on its own: a preempted trial (a loaded CPU)
    # then moves none of them.
    fwd, bwd, wall, launched = (statistics.median(t[i] for t in trials) for i in range(4))
    error = statistics.median((t[0] + t[1]) / t[2] - 1.0 for t in trials)
    ratio = bwd / fwd
    tolerance = 0.05 if cuda else 0.10
    tests = {f"phase sum within {tolerance:.0%} of wall": abs(error) <= tolerance}
    if cuda:  # on a shared CPU the ratio measures other processes, not the clock
        tests["backward/forward within 2 +- 10%"] = abs(ratio / 2.0 - 1.0) <= 0.10
        # The clock must leave the host free to run ahead (no sync per phase).
        tests["host launch time under half the device time"] = launched < 0.5 * (fwd + bwd)
    figure = (f"{n}+{2 * n} matmuls: phases {(fwd + bwd) * 1e3:.1f} ms vs wall "
              f"{wall * 1e3:.1f} ms ({error:+.1%}); bwd/fwd {ratio:.3f}; launch "
              f"{launched * 1e3:.1f} ms")
    return [row("phase_timing", what, figure, all(tests.values()), failed_reasons(tests),
                trials=trials, tolerance=tolerance)]


# ---------------------------------------------------------------- precision
def _train(device: torch.device, mode: str) -> dict[str, Any]:
    """A student MLP fits a teacher's outputs under Precision(mode), as tandem's step does."""
    cuda = device.type == "cuda"
    din, dout, width, steps, batch, n = ((64, 16, 512, 300, 256, 4096) if cuda
                                         else (32, 8, 64, 120, 64, 1024))
    x = torch.randn(n, din, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = mlp([din, 128, dout], seed=1)(x)
    x, y = x.to(device), y.to(device)
    model = mlp([din, width, width, dout], seed=2).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    precision = Precision(PrecisionConfig(mode=mode, init_scale=2.0**32, growth_interval=20),
                          device)
    params = list(model.parameters())
    watched = params[-2]  # the last layer's weight: changes on every applied update
    log: dict[str, Any] = {"loss": [], "scale": [], "changed": [], "dtype": ""}
    for step in range(steps):
        start = (step * batch) % n
        xb, yb = x[start:start + batch], y[start:start + batch]
        with precision.autocast():
            out = model(xb)
        log["dtype"] = str(out.dtype).removeprefix("torch.")
        loss = F.mse_loss(out.float(), yb)
        precision.backward(loss)
        before, scale = watched.detach().clone(), precision.loss_scale
        precision.grad_norm(optimizer, params, 0.0, Strategy.grad_norm)
        precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        log["loss"].append(loss.item())
        log["scale"].append((scale, precision.loss_scale))
        log["changed"].append(not torch.equal(before, watched.detach()))
    return log


def _precision_row(mode: str, log: dict[str, Any], fp32_last: float) -> Row:
    losses = log["loss"]
    first, last = statistics.fmean(losses[:10]), statistics.fmean(losses[-10:])
    skipped = [after < before for before, after in log["scale"]]
    grown = [after > before for before, after in log["scale"]]
    tests = {"losses finite": finite(losses),
             "loss fell below 30% of its start": last < 0.3 * first,
             f"autocast computed in {mode}": log["dtype"] == {"bf16": "bfloat16",
                                                             "fp16": "float16"}[mode]}
    if mode == "bf16":
        tests["loss scale stays 1"] = all(s == (1.0, 1.0) for s in log["scale"])
        tests["every step updated the weights"] = all(log["changed"])
        scale_text = "no scaling"
    else:
        tests["first step overflowed at 2^32 and was skipped"] = skipped[0] and not (
            log["changed"][0])
        tests["weights unchanged exactly on the skipped steps"] = all(
            c != s for c, s in zip(log["changed"], skipped, strict=True))
        tests["scale grew after 20 clean steps"] = any(grown)
        final = log["scale"][-1][1]
        scale_text = (f"scale 2^32 -> 2^{math.log2(final):.0f} ({sum(skipped)} skipped, "
                      f"{sum(grown)} growths)")
    figure = f"loss {first:.3g} -> {last:.3g} (fp32 {fp32_last:.3g}); {scale_text}"
    what = ("bf16 autocast trains a small MLP" if mode == "bf16"
            else "fp16 autocast + GradScaler: skips overflows, grows, trains")
    return row(f"precision_{mode}", what, figure, all(tests.values()), failed_reasons(tests),
               losses=losses[::10], scales=log["scale"][:40])


def precision(device: torch.device, work: Path, budget_s: float) -> list[Row]:
    """bf16 and fp16 (dynamic loss scaling) training through tandem's Precision."""
    fp32 = _train(device, "fp32")
    fp32_last = statistics.fmean(fp32["loss"][-10:])
    return [_precision_row(mode, _train(device, mode), fp32_last) for mode in ("bf16", "fp16")]


# ---------------------------------------------------------------- prefetch
def _prefetch_content(device: torch.device) -> Row:
    """train_batches' batches against the dataset rows its sampler names (exact sums)."""
    what = "train_batches (2 workers, pinned, side stream): batch content and order"
    cuda = device.type == "cuda"
    n, width, batch, steps = (512, 4096, 64, 24) if cuda else (256, 64, 32, 20)
    x = torch.arange(n * width, dtype=torch.float32).reshape(n, width)  # exact integers
    ids = torch.arange(n)

    def sampler() -> GlobalBatchSampler:
        return GlobalBatchSampler(dataset_len=n, global_batch=batch, accum=1, rank=0,
                                  world_size=1, seed=7, cursor=Cursor())

    cfg = DataConfig(workers=2, pin_memory=True, prefetch=2)
    batches = train_batches(torch.utils.data.TensorDataset(x, ids), sampler(), cfg, device)
    expected = iter(sampler())
    weights = torch.arange(1, batch + 1, dtype=torch.float64)[:, None]
    w_dev = weights.to(device)
    a, b = _square(device)
    got, want, places = [], [], set()
    for _ in range(steps):  # crosses epoch boundaries (n / batch = 8 steps an epoch)
        xb, ib = next(batches)
        places.add(xb.device.type)
        if cuda:  # keep the compute stream busy while the next copy is in flight
            for _ in range(4):
                torch.mm(a, b)
        # Position-weighted sums: exact in float64, and any misplaced row changes them.
        got.append(torch.stack([(xb.double() * w_dev).sum(), (ib.double() * w_dev[:, 0]).sum()]))
        index = next(expected)
        want.append([float((x[index].double() * weights).sum()),
                     float((ids[index].double() * weights[:, 0]).sum())])
    del batches  # stops the loader's workers
    got_values = torch.stack(got).cpu().tolist()
    wrong = sum(g != w for g, w in zip(got_values, want, strict=True))
    tests = {"batches on the training device": places == {device.type},
             "every batch's rows and order exact": wrong == 0}
    figure = f"{steps} batches of {batch} x {width}: {wrong} wrong"
    return row("prefetch_content", what, figure, all(tests.values()), failed_reasons(tests))


def _per_step(device: torch.device, steps: int, batches: Any, compute: Any) -> float:
    """Seconds per step of `compute` over `steps` batches from the iterator `batches`."""
    def loop() -> None:
        for _ in range(steps):
            compute(next(batches))
    return timed(device, loop) / steps


def _prefetch_overlap(device: torch.device) -> Row:
    """Host-to-device time left on the critical path: synchronous copy vs the prefetch."""
    what = "side-stream prefetch hides the h2d copy (vs a synchronous copy)"
    numel, steps = 16 * 2**20, 30  # 64 MiB batches
    host = [torch.full((numel,), float(i + 1)).pin_memory() for i in range(4)]
    resident = [h.to(device) for h in host]
    copy_s = statistics.median(timed(device, lambda: host[0].to(device, non_blocking=True))
                               for _ in range(5))
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    b = torch.randn_like(a)
    mm_s = timed(device, lambda: [torch.mm(a, b) for _ in range(20)]) / 20
    n_mm = max(1, round(3 * copy_s / mm_s))  # compute about 3x the copy
    sums: list[torch.Tensor] = []

    def compute(batch: torch.Tensor) -> None:
        for _ in range(n_mm):
            torch.mm(a, b)
        sums.append(batch.sum(dtype=torch.float64))

    def stream(kind: str) -> Any:
        order = [host[k % 4] for k in range(steps + 1)]
        if kind == "resident":
            return iter(resident[k % 4] for k in range(steps))
        if kind == "sync":
            return iter(to_device(h, device) for h in order)
        return _cuda_prefetch(iter(order), device)

    best: dict[str, float] = {}
    correct = True
    for _ in range(3):  # interleaved rounds; the best of each kind
        for kind in ("resident", "sync", "prefetch"):
            sums.clear()
            seconds = _per_step(device, steps, stream(kind), compute)
            best[kind] = min(best.get(kind, math.inf), seconds)
            values_seen = torch.stack(sums).cpu().tolist()
            correct &= values_seen == [float((k % 4 + 1) * numel) for k in range(steps)]
    on_path_sync = best["sync"] - best["resident"]
    on_path_prefetch = best["prefetch"] - best["resident"]
    tests = {"batch contents exact under overlap": correct,
             "synchronous copy shows on the critical path": on_path_sync >= 0.5 * copy_s,
             "prefetch leaves under 25% of the copy": on_path_prefetch <= 0.25 * copy_s}
    figure = (f"64 MiB copy {copy_s * 1e3:.2f} ms; on the critical path per step: "
              f"sync {on_path_sync * 1e3:.2f} ms, prefetch {on_path_prefetch * 1e3:.2f} ms "
              f"(compute {best['resident'] * 1e3:.2f} ms)")
    return row("prefetch_overlap", what, figure, all(tests.values()), failed_reasons(tests),
               per_step_s=best, copy_s=copy_s)


def prefetch(device: torch.device, work: Path, budget_s: float) -> list[Row]:
    """The loader's batches: exact content, and (CUDA) the copy hidden behind compute."""
    rows = [_prefetch_content(device)]
    if device.type == "cuda":
        rows.append(_prefetch_overlap(device))
    else:
        rows.append(skip("prefetch_overlap", "side-stream prefetch hides the h2d copy",
                         f"{NO_CUDA}: batches are copied on a side stream only on CUDA"))
    return rows


# ---------------------------------------------------------------- NVML
def nvml(device: torch.device, work: Path, budget_s: float) -> list[Row]:
    """GPU utilisation read by tandem's SystemSampler, busy and idle, against pynvml."""
    what = "NVML utilisation (SystemSampler) busy vs idle, against pynvml"
    try:
        import pynvml
    except ImportError:
        return [skip("nvml", what, "nvidia-ml-py (pynvml) is not importable")]
    if device.type != "cuda":
        return [skip("nvml", what, f"{NO_CUDA} (pynvml is importable)")]
    from tandem.monitor.system import SystemSampler, gpu_utilisation

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
    time.sleep(1.0)
    idle = gpu_utilisation(device).get("sys/gpu_util_percent", math.nan)
    sampler = SystemSampler(device)
    a, b = _square(device)
    readings: list[tuple[float, float]] = []
    start = time.perf_counter()
    while time.perf_counter() - start < 2.0:  # keep the queue full for 2 s
        for _ in range(8):
            torch.mm(a, b)
        if time.perf_counter() - start > 1.0 + 0.25 * len(readings) and len(readings) < 3:
            ours = gpu_utilisation(device).get("sys/gpu_util_percent", math.nan)
            readings.append((ours, float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)))
    sampled = sampler.sample().get("sys/gpu_util_percent", math.nan)
    sync(device)
    busy, direct = max(readings, key=lambda r: r[0]) if readings else (math.nan, math.nan)
    tests = {"sampler found NVML": sampler.gpu,
             "busy reading >= 50%": busy >= 50,
             "tandem's reading within 25 points of pynvml's": abs(busy - direct) <= 25,
             "the window sample carries sys/gpu_util_percent": math.isfinite(sampled)}
    figure = (f"busy {busy:.0f}% (pynvml {direct:.0f}%), idle {idle:.0f}%, "
              f"window sample {sampled:.0f}%")
    return [row("nvml", what, figure, all(tests.values()), failed_reasons(tests),
                readings=readings)]
