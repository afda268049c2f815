"""`tandem plan`'s predictions against measured runs of the char-LM on this host.

    python benchmarks/plan_check.py [--steps 40]

Five layouts on one or two processes (one process, DDP, FSDP, tensor parallel, a
two-stage pipeline), fp32, global batch 32 in micro-batches of 8. Per layout it prints the
planner's parameter, gradient and optimizer bytes per process against those the run
measured (`mem/param_bytes` + `mem/grad_bytes` + `mem/optim_bytes`, rank 0), and its step
time against the measured one (`time/step`, median of the windows after the first), and
the planner's step-time parts. The planner's efficiency (achieved share of peak) is set
from the one-process run: its step is the FLOPs' time at that efficiency plus the rest
(the optimizer's memory traffic), so that run's time matches by construction; the other
four are predictions, with this host's per-collective cost measured by the planner's probe
(`planner.host_probe`) before the runs.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _bench import (
    CHAR_LM,
    QUIET,
    child_env,
    planner_inputs,
    run_checked,
    steady,
    table,
    tandem_command,
    window_values,
)

from tandem.monitor.catalogue import MEM_GRAD, MEM_OPTIM, MEM_PARAM, TIME_STEP
from tandem.planner.layouts import Layout, Setting, estimate
from tandem.planner.machine import this_host

GLOBAL, MICRO = 32, 8
LAYOUTS = [  # name, processes, flags, planner layout (pp, dp, fsdp, tp)
    ("one process", 1, [], (1, 1, 1, 1)),
    ("ddp2", 2, ["--plan.strategy", "ddp"], (1, 2, 1, 1)),
    ("fsdp2", 2, ["--plan.strategy", "fsdp"], (1, 1, 2, 1)),
    ("tp2", 2, ["--plan.tp", "2"], (1, 1, 1, 2)),
    ("pp2", 2, ["--plan.pp", "2", "--plan.pp_schedule", "1F1B"], (2, 1, 1, 1)),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    _, profile, (states, orthogonalised, ns_steps) = planner_inputs(CHAR_LM)
    machine = this_host()
    print(f"per collective {machine.collective_s * 1e3:.2f} ms, memory "
          f"{machine.memory_bw / 1e9:.1f} GB/s (the planner's probe)")
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, procs, flags, _ in LAYOUTS:
            run = name.replace(" ", "-")
            cmd = tandem_command(["--nproc-per-node", str(procs)], CHAR_LM, [
                *flags, "--precision.mode", "fp32", "--train.global_batch", str(GLOBAL),
                "--train.micro_batch", str(MICRO), "--train.steps", str(args.steps),
                "--monitor.log_every", "5", "--monitor.calibrate_at", "10",
                "--train.eval_every", "0", "--run.dir", tmp, "--run.name", run, *QUIET])
            run_checked(cmd, timeout=900, env=child_env(), what=name)
            store = Path(tmp) / "tandem.db"
            state = sum(steady(window_values(store, run, m)) for m in (MEM_PARAM, MEM_GRAD,
                                                                      MEM_OPTIM))
            measured[name] = (state, steady(window_values(store, run, TIME_STEP)))
    def setting(efficiency: float) -> Setting:
        return Setting(GLOBAL, states, False, efficiency, orthogonalised, ns_steps)

    # step = F / efficiency + E: F from the step at efficiency 1 and 1/2.
    one = Layout(1, 1, 1, 1, MICRO, False)
    full = estimate(profile, one, machine, setting(1.0)).step_s
    flops = estimate(profile, one, machine, setting(0.5)).step_s - full
    efficiency = flops / (measured["one process"][1] - (full - flops))
    rows, within = [], 0
    for name, _, _, (pp, dp, fsdp, tp) in LAYOUTS:
        e = estimate(profile, Layout(pp, dp, fsdp, tp, MICRO, False), machine,
                     setting(efficiency))
        state = e.memory["weights"] + e.memory["gradients"] + e.memory["optimizer"]
        got_state, got_step = measured[name]
        ratio = got_step / e.step_s
        within += name != "one process" and abs(ratio - 1) <= 0.3
        rows.append([name, f"{state / 2**20:.2f}", f"{got_state / 2**20:.2f}",
                     f"{got_state / state:.3f}", f"{e.step_s * 1e3:.0f}",
                     f"{got_step * 1e3:.0f}", f"{ratio:.2f}",
                     ", ".join(f"{k} {v * 1e3:.0f}" for k, v in e.time_parts.items() if v)])
    print(f"efficiency from the one-process run: {efficiency:.2f} of the measured peak "
          f"{machine.peak / 1e9:.1f} GFLOP/s")
    print(table(["layout", "state MiB (plan)", "state MiB (run)", "run/plan",
                 "step ms (plan)", "step ms (run)", "run/plan", "plan's parts, ms"], rows))
    print(f"step time within 30%: {within} of {len(LAYOUTS) - 1} predicted layouts")


if __name__ == "__main__":
    main()
