"""`tandem plan`'s peak memory per process against the peak measured in runs of the char-LM.

    python benchmarks/plan_memory.py [--steps 4]

Six layouts on one or two processes (one process with and without activation
checkpointing, DDP, FSDP, tensor parallel, a two-stage 1F1B pipeline), fp32, AdamW, global
batch 32 in micro-batches of 8. Each run traces its tensor memory from the model's first
build to the end of the last step (`plan_memory_task.py`: torch's profiler, every
allocation and free); the measured figure is the highest process's peak of live tensor
bytes (replayed by address from the allocator's records). The planner's figure is its
memory per device for the same layout, by part (`tandem.planner.layouts`).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from _bench import QUIET, ROOT, child_env, planner_inputs, run_checked, table, tandem_command

from tandem.planner.layouts import Layout, Setting, estimate
from tandem.planner.machine import this_host

TASK = ROOT / "benchmarks" / "plan_memory_task.py"
GLOBAL, MICRO = 32, 8
LAYOUTS = [  # name, processes, flags, planner layout (pp, dp, fsdp, tp), recompute
    ("one process", 1, [], (1, 1, 1, 1), False),
    ("one, recompute", 1, ["--plan.activation_checkpointing", "true"], (1, 1, 1, 1), True),
    ("ddp2", 2, ["--plan.strategy", "ddp"], (1, 2, 1, 1), False),
    ("fsdp2", 2, ["--plan.strategy", "fsdp"], (1, 1, 2, 1), False),
    ("tp2", 2, ["--plan.tp", "2"], (1, 1, 1, 2), False),
    ("pp2", 2, ["--plan.pp", "2", "--plan.pp_schedule", "1F1B"], (2, 1, 1, 1), False),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    _, profile, (states, _, _) = planner_inputs(TASK)
    setting = Setting(GLOBAL, states, bf16=False, efficiency=1.0)
    machine = this_host()
    rows, within = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, procs, flags, (pp, dp, fsdp, tp), recompute in LAYOUTS:
            run = name.replace(" ", "").replace(",", "-")
            peaks = Path(tmp, "peaks", run)
            peaks.mkdir(parents=True)
            cmd = tandem_command(["--nproc-per-node", str(procs)], TASK, [
                *flags, "--precision.mode", "fp32", "--train.global_batch", str(GLOBAL),
                "--train.micro_batch", str(MICRO), "--train.steps", str(args.steps),
                "--monitor.calibrate_at", "0", "--train.eval_every", "0",
                "--run.dir", tmp, "--run.name", run, *QUIET])
            env = child_env({"PEAK_DIR": str(peaks), "PEAK_STEPS": str(args.steps)})
            run_checked(cmd, timeout=900, env=env, what=name)
            got = max(json.loads(f.read_text())["peak_bytes"] for f in peaks.glob("*.json"))
            e = estimate(profile, Layout(pp, dp, fsdp, tp, MICRO, recompute), machine,
                         setting)
            ratio = got / e.total_memory
            within += abs(ratio - 1) <= 0.1
            parts = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in e.memory.items())
            rows.append([name, f"{e.total_memory / 2**20:.1f}", parts, f"{got / 2**20:.1f}",
                         f"{ratio:.3f}"])
    print(table(["layout", "plan MiB", "plan parts MiB", "run peak MiB", "run/plan"], rows))
    print(f"peak memory within 10%: {within} of {len(LAYOUTS)} layouts")


if __name__ == "__main__":
    main()
