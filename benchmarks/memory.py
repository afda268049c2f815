"""Memory per rank, DDP against FSDP, at 2 and 4 processes.

    python benchmarks/memory.py [--nprocs 2 4] [--steps 20] [--hidden 2048] [--depth 4]

Trains the wide MNIST-1D model of `benchmarks/wide_mnist1d.py` (hidden 2048, depth 4:
12.7 M parameters, 51 MB in fp32; AdamW, so the optimizer holds two more copies) for a
few steps under `tandem run --nproc-per-node N`, with `plan.strategy ddp` and `fsdp`,
and has every rank report what it holds, by inspecting its own tensors:

- parameters: the local part of each parameter the optimizer updates (an FSDP2
  parameter is a DTensor: its local shard);
- gradients: the local part of each `.grad`, just before the optimizer step;
- optimizer state: every tensor in the optimizer's state, local parts;
- peak RSS: the process's resident high-water mark (`ru_maxrss`) at the last
  optimizer step, and that peak less the RSS measured just before the model was built
  (after imports, process group and data: what training itself added).

The same script is the training script: with TANDEM_MEMORY_OUT set it trains and writes
`rank<R>.json` there. The table gives FSDP / DDP per rank and the ideal 1/N; tandem's
own record of rank 0 (`mem/param_bytes`, `mem/grad_bytes`, `mem/optim_bytes` in the run
store, written at calibration) is checked against what rank 0 reported.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import (  # noqa: E402
    QUIET,
    child_env,
    run_checked,
    table,
    tandem_command,
    window_values,
)

OUT_ENV = "TANDEM_MEMORY_OUT"


# --------------------------------------------------------------------------- worker
def _local_bytes(tensor: Any) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def worker() -> None:
    """Train under tandem and write this rank's figures (run by `tandem run`)."""
    import torch
    import wide_mnist1d

    import tandem

    figures: dict[str, float] = {}
    trace: list[tuple[float, float]] = []  # (RSS, peak RSS) after each optimizer step

    def model() -> torch.nn.Module:
        # The first call only: fit builds a fresh copy of the model at its end.
        figures.setdefault("rss_before_model", psutil.Process().memory_info().rss)
        return wide_mnist1d.make_model()

    def optimizer(params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        opt = wide_mnist1d.make_optimizer(params)

        def before_step(opt: torch.optim.Optimizer, *_: Any) -> None:
            grads = [p.grad for g in opt.param_groups for p in g["params"]
                     if p.grad is not None]
            figures["grad_bytes"] = max(figures.get("grad_bytes", 0),
                                        sum(_local_bytes(g) for g in grads))

        def after_step(opt: torch.optim.Optimizer, *_: Any) -> None:
            figures["param_bytes"] = sum(_local_bytes(p) for g in opt.param_groups
                                         for p in g["params"])
            figures["optim_bytes"] = sum(_local_bytes(v) for s in opt.state.values()
                                         for v in s.values() if isinstance(v, torch.Tensor))
            figures["peak_rss"] = _peak_rss()
            figures["rss"] = psutil.Process().memory_info().rss
            figures.setdefault("peak_rss_first_step", figures["peak_rss"])
            trace.append((figures["rss"], figures["peak_rss"]))

        opt.register_step_pre_hook(before_step)
        opt.register_step_post_hook(after_step)
        return opt

    task = tandem.Task(model=model, optimizer=optimizer, train_data=wide_mnist1d.task.train_data,
                       eval_data=None, loss=wide_mnist1d.loss)
    tandem.fit(task, defaults=wide_mnist1d.RECIPE)
    rank = int(os.environ.get("RANK", "0"))
    figures["trace"] = trace  # type: ignore[assignment]
    Path(os.environ[OUT_ENV], f"rank{rank}.json").write_text(json.dumps(figures))


# --------------------------------------------------------------------------- driver
def measure(strategy: str, nproc: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One run; every rank's figures and tandem's record of rank 0."""
    name = f"mem-{strategy}-{nproc}-{int(time.time())}"
    ranks_dir = out / name
    ranks_dir.mkdir(parents=True)
    flags = ["--train.steps", str(args.steps), "--train.eval_every", "0",
             "--train.target", "", "--monitor.log_every", str(args.steps),
             "--monitor.calibrate_at", str(min(args.calibrate_at, args.steps)), *QUIET,
             "--run.dir", str(out), "--run.name", name, "--plan.strategy", strategy]
    env = child_env({OUT_ENV: str(ranks_dir), "WIDE_MNIST1D_HIDDEN": str(args.hidden),
                     "WIDE_MNIST1D_DEPTH": str(args.depth)})
    cmd = tandem_command(["--nproc-per-node", str(nproc)], Path(__file__).resolve(), flags)
    run_checked(cmd, timeout=args.timeout, env=env, what=name)
    ranks = [json.loads((ranks_dir / f"rank{r}.json").read_text()) for r in range(nproc)]
    store = out / "tandem.db"
    recorded = {key: (window_values(store, name, f"mem/{key}") or [float("nan")])[-1]
                for key in ("param_bytes", "grad_bytes", "optim_bytes")}
    return {"ranks": ranks, "recorded": recorded}


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--calibrate-at", type=int, default=10,
                        help="monitor.calibrate_at (0: no calibration, no mem/* in the store)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--out", default="", help="keep the runs here (default: a temp dir)")
    args = parser.parse_args()
    began = time.perf_counter()
    got: dict[tuple[str, int], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tandem-memory-") as tmp:
        out = Path(args.out).resolve() if args.out else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for nproc in args.nprocs:
            for strategy in ("ddp", "fsdp"):
                got[(strategy, nproc)] = measure(strategy, nproc, args, out)
                ranks = got[(strategy, nproc)]["ranks"]
                print(f"{strategy} x{nproc}: state per rank "
                      + ", ".join(_mb(r["param_bytes"] + r["grad_bytes"] + r["optim_bytes"])
                                  for r in ranks)
                      + " MB; peak RSS " + ", ".join(_mb(r["peak_rss"]) for r in ranks) + " MB",
                      flush=True)
    print(f"\nwide MNIST-1D model (hidden {args.hidden}, depth {args.depth}), AdamW, "
          f"{args.steps} steps; MB = 10^6 bytes; per rank: the largest rank (state) and the "
          f"median rank (RSS); total {time.perf_counter() - began:.0f} s\n")
    rows, ratios = [], []
    keys = ("param_bytes", "grad_bytes", "optim_bytes")
    for nproc in args.nprocs:
        per: dict[str, dict[str, float]] = {}
        for strategy in ("ddp", "fsdp"):
            ranks = got[(strategy, nproc)]["ranks"]
            fig = {k: max(r[k] for r in ranks) for k in keys}
            fig["state"] = max(sum(r[k] for k in keys) for r in ranks)
            fig["peak_rss"] = sorted(r["peak_rss"] for r in ranks)[len(ranks) // 2]
            fig["added"] = sorted(r["peak_rss"] - r["rss_before_model"]
                                  for r in ranks)[len(ranks) // 2]
            per[strategy] = fig
            rows.append([f"{strategy} x{nproc}", *(_mb(fig[k]) for k in keys),
                         _mb(fig["state"]), _mb(fig["peak_rss"]), _mb(fig["added"])])
            recorded = got[(strategy, nproc)]["recorded"]
            mine = ranks[0]
            off = {k: (recorded[k], mine[k]) for k in keys
                   if recorded[k] == recorded[k] and recorded[k] != mine[k]}
            if off:
                print(f"note: {strategy} x{nproc}: run store mem/* (rank 0) differs from what "
                      f"rank 0 counted: " + ", ".join(f"{k} {a:,.0f} vs {b:,.0f}"
                                                      for k, (a, b) in off.items()))
        ratio = {k: per["fsdp"][k] / per["ddp"][k] for k in (*keys, "state", "peak_rss",
                                                                "added")}
        ratios.append([str(nproc), *(f"{ratio[k]:.3f}" for k in (*keys, "state", "peak_rss",
                                                                   "added")),
                       f"{1 / nproc:.3f}"])
    print(table(["run", "params MB", "grads MB", "optimizer MB", "state MB", "peak RSS MB",
                 "RSS added MB"], rows))
    print()
    print(table(["N", "params", "grads", "optimizer", "state", "peak RSS", "RSS added",
                 "ideal 1/N"], ratios))


if __name__ == "__main__":
    if os.environ.get(OUT_ENV):
        worker()
    else:
        main()
