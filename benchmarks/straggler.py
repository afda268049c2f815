"""Time to the MNIST-1D demo's target with one of N workers slowed 2x: bounded-staleness
asynchronous updates against synchronous DDP and blocking DiLoCo.

    python benchmarks/straggler.py [--seeds 5] [--steps 150] [--target accuracy>=0.9]
        [--staleness 2] [--sync-every 4] [--outer-momentum 0.9] [--plans async ddp diloco]
        [--workers 4] [--slow-rank N-1] [--slow-factor 1] [--slow-s S] [--out DIR]
    python benchmarks/straggler.py --exchange      # the exchange's channels, timed alone

Each plan trains the demo's recipe (`examples/mnist1d_cnn.py`: global batch 128, Muon,
its EMA evaluation) on N processes (`tandem run --nproc-per-node N`) for `--steps`
steps, evaluating every 10, with the same worker slowed by the fault hook
`TANDEM_FAULTS=[{"rank": R, "step": 0, "until": STEPS, "kind": "slow", "phase": "optim",
"factor": F}]`: before each of its optimizer steps that worker sleeps F times as long as
the step has taken so far (F = 1: its steps take twice as long, whatever the host's load;
under DDP "so far" includes its wait in the gradient all-reduce). `--slow-s S` sleeps S
seconds a step instead. Plans: `async` (plan.staleness,
plan.sync_every), `ddp`, `diloco` (the same plan.sync_every, its default outer step).
The plans of a seed run one after another, their order rotated from seed to seed.

Figures: tandem's own `time_to_target_s` (train time to the first evaluation at the
target) and the final accuracy of each run; per seed, DDP's and DiLoCo's time over
async's (x sooner), printed as median [lowest, highest] over the seeds. A plan that
never reaches the target counts as never (its ratios are left out and it is said so).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _bench import QUIET, ROOT, child_env, run_checked, summary, table, tandem_command

DEMO = ROOT / "examples" / "mnist1d_cnn.py"
PLANS = ("async", "ddp", "diloco")


def run(out: Path, name: str, plan: str, seed: int, args: argparse.Namespace,
        slowed: bool = True) -> dict[str, float]:
    """One run of the demo under `plan`, one worker slowed (unless not `slowed`); its
    figures."""
    flags = [*QUIET, "--run.dir", str(out), "--run.name", name, "--run.seed", str(seed),
             "--train.steps", str(args.steps), "--train.eval_every", "10",
             "--train.target", args.target, "--monitor.calibrate_at", "0",
             "--plan.strategy", plan, "--plan.sync_every", str(args.sync_every),
             "--plan.staleness", str(args.staleness),
             "--plan.outer_momentum", str(args.outer_momentum),
             "--plan.outer_lr", str(args.outer_lr)]
    slow = {"seconds": args.slow_s} if args.slow_s > 0 else {"phase": "optim",
                                                              "factor": args.slow_factor}
    extra = {"TANDEM_FAULTS": json.dumps([{"rank": args.slow_rank, "step": 0,
                                           "until": args.steps, "kind": "slow", **slow}]
                                         if slowed else [])}
    cmd = tandem_command(["--nproc-per-node", str(args.workers)], DEMO, flags)
    run_checked(cmd, timeout=1800, env=child_env(extra), what=f"{plan} seed {seed}")
    got = summary(out / name)
    return {"to_target_s": float(got.get("time_to_target_s", math.nan)),
            "accuracy": float(got.get("accuracy", math.nan)),
            "step_s": float(got.get("step_time_p50_s", math.nan)),
            "wall_s": float(got.get("wall_time_s", math.nan))}


def _exchange(rank: int, world: int, n: int, repeats: int) -> None:
    """Time, on 2 gloo processes, what one push and one pull of an n-value model cost
    through the store (set, then get by the other) against gloo's all-reduce and send/recv
    of the same tensor (every rank must take part in those at that moment)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    store, x = dist.distributed_c10d._get_default_store(), torch.randn(n)
    payload = x.numpy().tobytes()
    timings: dict[str, float] = {}
    for name, once in (
            ("store set + get", lambda k: (store.set(f"p{k}", payload) if rank == 0
                                           else store.get(f"p{k}"))),
            ("gloo all_reduce", lambda k: dist.all_reduce(x)),
            ("gloo send/recv", lambda k: dist.send(x, 1) if rank == 0 else dist.recv(x, 0))):
        dist.barrier()
        began = time.perf_counter()
        for k in range(repeats):
            once(k)
        dist.barrier()
        timings[name] = (time.perf_counter() - began) / repeats
    if rank == 0:
        print(f"{n} values ({n * 4 / 2**10:.0f} KiB), {repeats} repeats: " + ", ".join(
            f"{k} {v * 1e3:.2f} ms" for k, v in timings.items()), flush=True)
    dist.destroy_process_group()


def spread(values: list[float]) -> str:
    """median [lowest, highest] of the finite values."""
    kept = sorted(v for v in values if math.isfinite(v))
    if not kept:
        return "-"
    return f"{statistics.median(kept):.2f} [{kept[0]:.2f}, {kept[-1]:.2f}]"


def report(results: dict[tuple[str, int], dict[str, float]], seeds: list[int],
           plans: list[str]) -> str:
    """Per plan: seeds that reached the target, median time to it, x sooner than async's
    per seed, final accuracy (mean, and its difference from async's per seed)."""
    rows = []
    for plan in plans:
        times = [results[(plan, s)]["to_target_s"] for s in seeds]
        acc = [results[(plan, s)]["accuracy"] * 100 for s in seeds]
        over = [t / results[("async", s)]["to_target_s"] for t, s in zip(times, seeds,
                                                                          strict=True)]
        diff = [a - results[("async", s)]["accuracy"] * 100 for a, s in zip(acc, seeds,
                                                                            strict=True)]
        reached = [t for t in times if math.isfinite(t)]
        rows.append([plan, f"{len(reached)}/{len(seeds)}",
                     f"{statistics.median(reached):.1f}" if reached else "never",
                     spread(over), f"{statistics.fmean(acc):.2f}", spread(diff),
                     f"{statistics.median(results[(plan, s)]['step_s'] for s in seeds) * 1e3:.0f}"])
    return table(["plan", "reached", "to target s (median)", "time / async's (x sooner)",
                  "final acc %", "acc - async's (points)", "step p50 ms"], rows)


def main() -> int:
    """Run the plans over the seeds, print the per-seed figures and the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--target", default="accuracy>=0.9")
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--sync-every", type=int, default=4)
    parser.add_argument("--outer-momentum", type=float, default=0.9,
                        help="plan.outer_momentum of async and diloco")
    parser.add_argument("--outer-lr", type=float, default=0.7,
                        help="plan.outer_lr of async and diloco")
    parser.add_argument("--plans", nargs="+", choices=PLANS, default=list(PLANS))
    parser.add_argument("--workers", type=int, default=4,
                        help="processes (workers); with more than the host's cores, a "
                        "sleeping worker's core goes to the others")
    parser.add_argument("--slow-rank", type=int, default=-1,
                        help="the slowed worker (default: the last)")
    parser.add_argument("--slow-factor", type=float, default=1.0,
                        help="the slowed worker sleeps this many times its step's time")
    parser.add_argument("--slow", choices=("fixed", "relative"), default="fixed",
                        help="fixed: sleep --slow-factor x the step time of an unslowed DDP "
                        "run measured first; relative: --slow-factor x the step's own time")
    parser.add_argument("--slow-s", type=float, default=0.0,
                        help="seconds the slowed worker sleeps a step instead (0: off)")
    parser.add_argument("--out", default="")
    parser.add_argument("--exchange", action="store_true",
                        help="only time the exchange's channels (the demo's model size, and "
                        "1 M values)")
    args = parser.parse_args()
    if "async" not in args.plans:
        parser.error("--plans: the ratios are against async's runs; include async")
    if args.exchange:
        sys.path.insert(0, str(ROOT))
        from tests.dist.procs import run_ranks

        print(f"host load (1/5/15 min): {os.getloadavg()}", flush=True)
        for n in (63_000, 1_000_000):
            run_ranks(_exchange, 2, n, 50, timeout=300)
        return 0
    out = Path(args.out or tempfile.mkdtemp(prefix="straggler-"))
    began = time.perf_counter()
    print(f"host load (1/5/15 min): {os.getloadavg()}", flush=True)
    seeds = list(range(args.seeds))
    if args.slow_rank < 0:
        args.slow_rank = args.workers - 1
    if args.slow == "fixed" and args.slow_s <= 0:
        normal = run(out, "calibrate", "ddp", 0, args, slowed=False)
        args.slow_s = args.slow_factor * normal["step_s"]
        print(f"calibration (ddp, no worker slowed): {normal}; the slowed worker sleeps "
              f"{args.slow_factor} x its step p50 = {args.slow_s * 1e3:.1f} ms a step",
              flush=True)
    results: dict[tuple[str, int], dict[str, float]] = {}
    for seed in seeds:
        plans = [p for p in PLANS if p in args.plans]
        order = plans[seed % len(plans):] + plans[:seed % len(plans)]
        for plan in order:
            results[(plan, seed)] = got = run(out, f"{plan}-s{seed}", plan, seed, args)
            print(f"seed {seed} {plan}: {got}", flush=True)
    slowed = f"{args.slow_s:.3f} s" if args.slow_s > 0 else f"{args.slow_factor}x its time"
    print(f"\n{args.seeds} seeds, {args.steps} steps, target {args.target}, rank "
          f"{args.slow_rank} sleeps {slowed} a step, async s={args.staleness}, "
          f"H={args.sync_every}; total {time.perf_counter() - began:.0f} s; load now "
          f"{os.getloadavg()}\n")
    print(report(results, seeds, [p for p in PLANS if p in args.plans]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
