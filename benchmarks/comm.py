"""Communication plans side by side: bytes on the wire, step time and final quality.

    python benchmarks/comm.py [--tasks mnist1d char_lm] [--repeats 1]
        [--mnist-steps 400] [--lm-steps 100] [--plans none fp16 powersgd ...]
        [--plan NAME=key=value,key=value ...] [--out DIR]

Two tasks at 2 processes (`tandem run --nproc-per-node 2`): MNIST-1D on a 4.3 M-parameter
model (`benchmarks/wide_mnist1d.py`: a narrow CNN under a wide MLP, so gradients are
17 MB a step) and the char-LM example (0.83 M parameters). Each task is trained under
every plan, the plans interleaved within a repeat (repeat i uses seed i):

    none      DDP, fp32 ring all-reduce (the reference row)
    fp16      DDP, gradients all-reduced in fp16
    powersgd  DDP, PowerSGD (plan.powersgd_rank, plan.powersgd_warmup: tandem's defaults)
    topk      DDP, top-k 1% with error feedback
    localsgd  parameter averaging every plan.sync_every = 8 steps
    diloco    DiLoCo, outer Nesterov step every 8 steps

`--plan NAME=plan.comm_hook=powersgd,plan.powersgd_rank=4` adds a plan of one's own.

Figures per run: bytes per step as tandem records them (`comm/bytes_per_step`): for a
DDP comm hook, its count of what it sent, averaged over its last 20 steps, median over
the logging windows after the first (the steady state, after PowerSGD's warm-up; the
whole run's mean is printed under the table); for local SGD / DiLoCo, all meeting bytes
over all steps. Step time: median over the windows after the first of the window's
training time over its steps, meetings included. Final test accuracy (MNIST-1D) or
validation bits per byte (char-LM); time to the MNIST-1D target (95%, evaluated every
50 steps). Ratios are against the fp32 all-reduce row of the same repeat.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import (  # noqa: E402
    CHAR_LM,
    QUIET,
    WIDE_MNIST1D,
    child_env,
    mib,
    run_checked,
    steady,
    summary,
    table,
    tandem_command,
    window_steps,
    window_values,
)

PLANS: dict[str, dict[str, str]] = {
    "none": {"plan.strategy": "ddp", "plan.comm_hook": "none"},
    "fp16": {"plan.strategy": "ddp", "plan.comm_hook": "fp16"},
    "powersgd": {"plan.strategy": "ddp", "plan.comm_hook": "powersgd"},
    "topk": {"plan.strategy": "ddp", "plan.comm_hook": "topk"},
    "localsgd": {"plan.strategy": "localsgd", "plan.sync_every": "8"},
    "diloco": {"plan.strategy": "diloco", "plan.sync_every": "8"},
}


@dataclass
class TaskSpec:
    """A training script, its quality metric and the flags that shape a short run."""

    script: Path
    metric: str  # summary key of the final quality figure
    higher_is_better: bool
    flags: list[str] = field(default_factory=list)


def task_specs(mnist_steps: int, lm_steps: int) -> dict[str, TaskSpec]:
    """The benchmark's two tasks at the requested lengths."""
    return {
        "mnist1d": TaskSpec(WIDE_MNIST1D, "accuracy", True,
                            ["--train.steps", str(mnist_steps), "--monitor.log_every", "25"]),
        "char_lm": TaskSpec(CHAR_LM, "bits_per_byte", False,
                            ["--train.steps", str(lm_steps), "--train.eval_every", "0",
                             "--optim.warmup_steps", str(max(1, lm_steps // 10)),
                             "--monitor.log_every", "10"]),
    }


def parse_plan(text: str) -> tuple[str, dict[str, str]]:
    """'NAME=key=value,key=value' -> (NAME, {key: value})."""
    name, sep, rest = text.partition("=")
    if not sep or not rest:
        raise argparse.ArgumentTypeError(f"--plan {text!r}: write NAME=key=value,key=value")
    settings = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        if not eq:
            raise argparse.ArgumentTypeError(f"--plan {text!r}: {item!r} is not key=value")
        settings[key.strip()] = value.strip()
    return name, settings


def run_one(spec: TaskSpec, plan: dict[str, str], out: Path, name: str, seed: int,
            nproc: int, timeout: float) -> dict[str, float]:
    """One run of a task under a plan; its figures."""
    flags = [*spec.flags, *QUIET, "--run.dir", str(out), "--run.name", name,
             "--run.seed", str(seed)]
    for key, value in plan.items():
        flags += [f"--{key}", value]
    cmd = tandem_command(["--nproc-per-node", str(nproc)], spec.script, flags)
    started = time.perf_counter()
    run_checked(cmd, timeout=timeout, env=child_env(), what=f"{name}")
    launch_s = time.perf_counter() - started
    result = summary(out / name)
    store = out / "tandem.db"
    sent = window_values(store, name, "comm/bytes_per_step")
    if plan.get("plan.strategy") in ("localsgd", "diloco"):
        # Each window holds the meeting bytes over its own steps: weight by those steps
        # for the whole run's bytes over its steps (the last meeting is forced).
        steps = [int(s) for s in window_steps(store, name, "comm/bytes_per_step")]
        spans = [b - a for a, b in zip([0, *steps[:-1]], steps, strict=True)]
        bytes_per_step = sum(v * n for v, n in zip(sent, spans, strict=True)) / steps[-1]
    else:
        bytes_per_step = steady(sent)  # after the hook's warm-up
    return {
        "bytes": bytes_per_step,
        "step_s": steady(window_values(store, name, "time/step")),
        "quality": float(result.get(spec.metric, float("nan"))),
        "wall_s": float(result["wall_time_s"]),
        "to_target_s": float(result.get("time_to_target_s", float("nan"))),
        "launch_s": launch_s,
    }


def report(task: str, spec: TaskSpec, plans: list[str],
           results: dict[tuple[str, str, int], dict[str, float]], repeats: int) -> str:
    """The task's table: medians over repeats, ratios to the fp32 all-reduce row."""

    def med(plan: str, key: str) -> float:
        return statistics.median(results[(task, plan, i)][key] for i in range(repeats))

    def delta(plan: str) -> float:
        # Per repeat (same seed) difference, then the median: seed noise cancels.
        return statistics.median(results[(task, plan, i)]["quality"]
                                 - results[(task, "none", i)]["quality"]
                                 for i in range(repeats))

    base_bytes, base_step = med("none", "bytes"), med("none", "step_s")
    quality = "accuracy %" if spec.higher_is_better else "bits/byte"
    header = ["plan", "MiB/step", "x fewer", "step ms", "x time", quality,
              "vs fp32" + (" (points)" if spec.higher_is_better else ""), "run s"]
    if task == "mnist1d":
        header.append("to 95% s")
    rows = []
    for plan in plans:
        sent, step = med(plan, "bytes"), med(plan, "step_s")
        value, diff = med(plan, "quality"), delta(plan)
        scale = 100.0 if spec.higher_is_better else 1.0
        row = [plan, mib(sent), f"{base_bytes / sent:,.1f}" if sent else "-",
               f"{step * 1e3:,.1f}", f"{step / base_step:.2f}",
               f"{value * scale:.2f}" if spec.higher_is_better else f"{value:.4f}",
               f"{diff * scale:+.2f}" if spec.higher_is_better else f"{diff:+.4f}",
               f"{med(plan, 'wall_s'):.1f}"]
        if task == "mnist1d":
            reached = med(plan, "to_target_s")
            row.append("-" if reached != reached else f"{reached:.1f}")  # NaN: not reached
        rows.append(row)
    return table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["mnist1d", "char_lm"],
                        choices=["mnist1d", "char_lm"])
    parser.add_argument("--plans", nargs="+", default=list(PLANS), choices=list(PLANS))
    parser.add_argument("--plan", action="append", type=parse_plan, default=[],
                        help="an extra plan NAME=key=value,key=value (repeatable)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--mnist-steps", type=int, default=400)
    parser.add_argument("--lm-steps", type=int, default=100)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--out", default="", help="keep the runs here (default: a temp dir)")
    args = parser.parse_args()
    plans = dict(PLANS)
    for name, settings in args.plan:
        plans[name] = {"plan.strategy": "ddp", **settings}
    names = ["none", *[p for p in args.plans if p != "none"], *(n for n, _ in args.plan)]
    specs = task_specs(args.mnist_steps, args.lm_steps)
    results: dict[tuple[str, str, int], dict[str, float]] = {}
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tandem-comm-") as tmp:
        out = Path(args.out).resolve() if args.out else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for i in range(args.repeats):
            for task in args.tasks:
                for plan in names:
                    run_name = f"comm-{task}-{plan}-{i}-{int(time.time())}"
                    got = run_one(specs[task], plans[plan], out, run_name, i, args.nproc,
                                  args.timeout)
                    results[(task, plan, i)] = got
                    print(f"{task:8s} {plan:12s} seed {i}: {mib(got['bytes'])} MiB/step, "
                          f"{got['step_s'] * 1e3:.1f} ms/step, "
                          f"{specs[task].metric} {got['quality']:.4f}, "
                          f"run {got['wall_s']:.1f} s (launch to exit {got['launch_s']:.1f} s)",
                          flush=True)
    print(f"\n{args.nproc} processes, {args.repeats} repeat(s), medians; "
          f"total {time.perf_counter() - began:.0f} s")
    for task in args.tasks:
        steps = args.mnist_steps if task == "mnist1d" else args.lm_steps
        print(f"\n{task} ({steps} steps)\n")
        print(report(task, specs[task], names, results, args.repeats))
        _warmup_note(task, names, plans, results, args.repeats, steps)


def _warmup_note(task: str, names: list[str], plans: dict[str, dict[str, str]],
                 results: dict[tuple[str, str, int], dict[str, float]], repeats: int,
                 steps: int) -> None:
    """PowerSGD sends fp32 during its warm-up: the whole run's mean, next to the steady one."""
    full = statistics.median(results[(task, "none", i)]["bytes"] for i in range(repeats))
    for plan in names:
        settings = plans[plan]
        if settings.get("plan.comm_hook") != "powersgd":
            continue
        warm = min(steps, int(settings.get("plan.powersgd_warmup", "10")))
        compressed = statistics.median(results[(task, plan, i)]["bytes"] for i in range(repeats))
        mean = (warm * full + (steps - warm) * compressed) / steps
        print(f"  {plan}: the first {warm} steps go uncompressed; over {steps} steps the mean "
              f"is {mib(mean)} MiB/step ({full / mean:,.1f} x fewer than fp32)")


if __name__ == "__main__":
    main()
