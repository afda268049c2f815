"""The process-group check: a real `tandem run` worker on an NCCL group of one, tandem.fit
on that group, DDP through tandem's strategy, and the bf16 hook that gloo refuses.

tandem makes no process group at world size 1 (there is nothing to synchronise), and
NCCL refuses two ranks on one GPU, so the worker makes the one-rank group itself, as a
user script may: tandem's runtime then reuses it.
"""

from __future__ import annotations

import json
import os
import statistics
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from _bench import ROOT, child_env, tandem_command
from _gpu_common import (
    Row,
    ends,
    failed_reasons,
    fit_here,
    mlp,
    row,
    run_tree,
    sync,
    tail,
    timed,
    tiny_task,
    values,
)
from torch.nn import functional as F

from tandem.config import PlanConfig
from tandem.parallel.ddp import DDPStrategy
from tandem.parallel.mesh import layout
from tandem.runtime import start

WORKER = ROOT / "benchmarks" / "gpu_check.py"


def nccl_ddp(device: torch.device, work: Path, budget_s: float) -> list[Row]:
    """Launch the worker through `tandem run --nproc-per-node 1`; return its rows."""
    result = work / "nccl_worker.json"
    log = work / "nccl.log"
    cmd = tandem_command(["--nproc-per-node", "1"], WORKER,
                         ["--worker", "nccl", "--device", device.type, "--result", str(result),
                          "--work", str(work)])
    code = run_tree(cmd, timeout=budget_s, env=child_env(), log=log)
    if code == 0 and result.is_file():
        return json.loads(result.read_text())
    why = f"ran past {budget_s:.0f} s" if code is None else f"exit {code}"
    return [row("nccl_group", "tandem run --nproc-per-node 1 worker on an NCCL group", "",
                False, f"{why}: {tail(log, 800)}")]


def _collectives(device: torch.device, backend: str, work: Path) -> list[Row]:
    what = "process group of one under `tandem run`: all_reduce, all_gather"
    values_in = torch.arange(1, 5, dtype=torch.float32, device=device)
    reduced = values_in.clone()
    dist.all_reduce(reduced)
    gathered = [torch.zeros_like(values_in)]
    dist.all_gather(gathered, values_in)
    big = torch.ones(64 * 2**20, device=device)  # 256 MiB
    dist.all_reduce(big)
    seconds = statistics.median(timed(device, lambda: dist.all_reduce(big)) for _ in range(5))
    tests = {f"backend is {backend}": dist.get_backend() == backend,
             "world size 1": dist.get_world_size() == 1,
             "launched by tandem run (torchrun)": "TORCHELASTIC_RUN_ID" in os.environ,
             "all_reduce and all_gather exact": torch.equal(reduced, values_in)
                 and torch.equal(gathered[0], values_in) and bool((big == 1).all())}
    figure = f"{backend}, world 1; 256 MiB all_reduce {seconds * 1e3:.2f} ms"
    return [row("nccl_group", what, figure, all(tests.values()), failed_reasons(tests))]


def _fit_on_group(device: torch.device, backend: str, work: Path) -> list[Row]:
    what = "tandem.fit on the group (config agreement gathered through it)"
    _, record = fit_here(tiny_task(), work, "nccl_fit", {
        "plan.backend": backend, "plan.strategy": "ddp", "train.steps": 20,
        "train.global_batch": 64, "monitor.log_every": 10})
    losses = values(record, "loss")
    tests = {"run completed": record["status"] == "completed",
             f"ran on {device.type}": str(record["env"].get("device", "")).startswith(
                 device.type),
             "loss fell": len(losses) > 1 and losses[-1] < losses[0],
             "the user's group left alive": dist.is_initialized()}
    figure = f"20 steps on {record['env'].get('device')}; loss {ends(losses, 3)}"
    return [row("nccl_fit", what, figure, all(tests.values()), failed_reasons(tests))]


def _ddp_grads(device: torch.device, backend: str, hook: str, x: torch.Tensor,
               y: torch.Tensor) -> tuple[list[torch.Tensor], int]:
    """Gradients of two steps' second backward through tandem's DDPStrategy with `hook`;
    the number of steps its counting hook saw."""
    plan = PlanConfig(backend=backend, strategy="ddp", comm_hook=hook)  # type: ignore[arg-type]
    runtime = start(plan)  # reuses the group
    strategy = DDPStrategy(plan, runtime, layout(1, runtime.rank, runtime.world_size, device),
                           seed=0)
    model = strategy.wrap(lambda: mlp([64, 512, 512, 8], seed=3))
    for _ in range(2):  # DDP rebuilds its buckets after the first step
        model.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
    sync(device)
    steps = strategy.stats.steps if strategy.stats is not None else 0
    return [p.grad.detach().clone() for p in strategy.module.parameters()], steps


def _ddp_strategy(device: torch.device, backend: str, work: Path) -> list[Row]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 64, generator=generator).to(device)
    y = torch.randn(256, 8, generator=generator).to(device)
    plain = mlp([64, 512, 512, 8], seed=3).to(device)
    F.mse_loss(plain(x), y).backward()
    reference = [p.grad.detach() for p in plain.parameters()]

    def deviation(grads: list[torch.Tensor]) -> float:
        return max(float((g - r).abs().max() / r.abs().max())
                   for g, r in zip(grads, reference, strict=True))

    rows = []
    grads, steps = _ddp_grads(device, backend, "none", x, y)
    error = deviation(grads)
    tests = {"gradients equal plain PyTorch's (1e-6)": error <= 1e-6,
             "the all-reduce hook ran on both steps": steps == 2}
    rows.append(row("ddp_allreduce", f"DDPStrategy all-reduce on {backend} vs plain gradients",
                    f"max deviation {error:.1e}; hook steps {steps}", all(tests.values()),
                    failed_reasons(tests)))
    half = "bf16" if backend == "nccl" else "fp16"  # gloo refuses bf16 all-reduce
    grads, steps = _ddp_grads(device, backend, half, x, y)
    error, bound = deviation(grads), (2.0**-8 if half == "bf16" else 2.0**-11) * 1.01
    tests = {f"gradients rounded to {half} (0 < deviation <= {bound:.1e})": 0 < error <= bound,
             "the hook ran on both steps": steps == 2}
    rows.append(row("ddp_half_hook", f"comm_hook {half} on {backend} vs plain gradients",
                    f"max deviation {error:.1e} (bound {bound:.1e})", all(tests.values()),
                    failed_reasons(tests)))
    return rows


def worker(device_type: str, result: Path, work: Path) -> None:
    """The `tandem run` worker: make the group, run each part, write the rows, clean up."""
    cuda = device_type == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else (
        torch.device("cpu"))
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, device_id=device if cuda else None)
    parts: list[tuple[str, Callable[[torch.device, str, Path], list[Row]]]] = [
        ("nccl_group", _collectives), ("nccl_fit", _fit_on_group), ("ddp", _ddp_strategy)]
    rows: list[Row] = []
    try:
        for name, part in parts:
            try:
                rows += part(device, backend, work)
            except Exception as err:  # noqa: BLE001 - one part failing must not hide the others
                rows.append(row(name, f"{name} on {backend}", "", False,
                                f"{type(err).__name__}: {err} | "
                                f"{traceback.format_exc(limit=3)[-600:]}"))
    finally:
        result.write_text(json.dumps(rows))
        dist.destroy_process_group()
