"""How the live testbed's job mix was chosen, and how its goodput policy depends on the pin:
the simulator on the testbed's jobs, with the rates a live run measured.

    python benchmarks/sched_testbed_mix.py

Every figure here is simulated (`tandem.sched.simulate`, 2 slots, 2-s decisions, `Pinned`
as the service runs it). The rates and start-ups are the medians the live testbed measured
on 2026-12-01 (MNIST-1D jobs 4,470 samples/s on 1 process and 6,400 on 2; char-LM jobs 88
and 165; start-up 4.3 s and 4.9 s). Printed:

1. goodput's mean JCT on the first mix for each pin length, with admission by exact
   attained service (`las_band` tiny) and by doubling bands (the default, 60 s);
2. the search: 400 random variations of the first mix's arrival times and sizes (seed 1),
   those with >= 9 resizes and preemptions over the three policies and goodput well ahead
   of FIFO and Tiresias-like;
3. for the first mix and the chosen one, 30 simulations with every rate and start-up moved
   by up to +-10% and arrivals by up to 1 s: how often each testbed target holds;
4. the chosen mix at the rates and start-ups of the live runs of 2026-12-02 (runs 3 and 4:
   MNIST-1D 4,800 and 6,400 samples/s, char-LM 128 and 211, start-up 3.2 s and 3.95 s),
   with every job's steps scaled as `sched_testbed.py --scale S` scales them: the same 30
   perturbations, for each S.
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tandem.sched import POLICIES, Cluster, GoodputPolicy, JobSpec, simulate  # noqa: E402
from tandem.sched.policies.pinning import Pinned  # noqa: E402
from tandem.sched.simulation.measured_app import MeasuredApplication  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import sched_testbed  # noqa: E402

RATES = {"m": {1: 4470.0, 2: 6400.0}, "c": {1: 88.0, 2: 165.0}}
STARTUP = {"m": 4.3, "c": 4.9}
BATCH = {"m": 128, "c": 32}
TEARDOWN = 0.5
RATES_DEC02 = {"m": {1: 4800.0, 2: 6400.0}, "c": {1: 128.0, 2: 211.0}}
STARTUP_DEC02 = {"m": 3.2, "c": 3.95}
# (name, kind, steps, processes, submitted at)
FIRST = [("mnist-long", "m", 3600, "1:2", 0), ("charlm-a", "c", 144, "1:2", 10),
         ("mnist-rigid", "m", 1000, "2", 20), ("mnist-short", "m", 600, "1:2", 40),
         ("charlm-b", "c", 96, "1", 60), ("mnist-mid", "m", 1600, "1:2", 80),
         ("charlm-c", "c", 96, "1:2", 110), ("mnist-tiny", "m", 480, "1", 140)]
CHOSEN = [(j.name, "m" if j.kind == sched_testbed.MNIST else "c", j.steps, j.procs, j.at)
          for j in sched_testbed.JOBS]  # the testbed's mix


def policy(name: str, pin: float, band: float = 60.0) -> Pinned:
    inner = (POLICIES["tiresias"](thresholds=(60.0,)) if name == "tiresias"
             else GoodputPolicy(las_band=band) if name == "goodput" else POLICIES[name]())
    return Pinned(inner, pin)


def run(mix, name: str, pin: float = 15.0, band: float = 60.0, rates=RATES,
        startup=STARTUP):
    """One simulation of `mix` under policy `name`; None if it never finishes."""
    apps, specs = {}, []
    for job, kind, steps, procs, at in mix:
        low, _, high = procs.partition(":")
        sizes = range(int(low), int(high or low) + 1)
        apps[job] = MeasuredApplication(job, BATCH[kind], steps,
                                        {p: rates[kind][p] for p in sizes})
        specs.append(JobSpec(job_id=job, submit_time=at, min_procs=int(low),
                             max_procs=int(high or low), batch_size=BATCH[kind],
                             limits=apps[job].limits, application=job))
    try:
        return simulate(specs, apps, policy(name, pin, band), Cluster(nodes=1, slots_per_node=2),
                        interval=2.0, restart_delays={j: startup[k] for j, k, *_ in mix},
                        max_time=3000.0)
    except ValueError:
        return None


def verdict(mix, **kw) -> tuple[float, float, int]:
    """goodput's mean JCT below FIFO and below Tiresias-like (fractions); resizes and
    preemptions over the three policies."""
    out = {p: run(mix, p, **kw) for p in ("fifo", "tiresias", "goodput")}
    jct = {p: r.mean_jct + TEARDOWN for p, r in out.items()}
    moves = sum(r.resizes + r.preemptions for r in out.values())
    return 1 - jct["goodput"] / jct["fifo"], 1 - jct["goodput"] / jct["tiresias"], moves


def main() -> None:
    print("1. goodput on the first mix, mean JCT (s) / restarts, by pin length (s)")
    for label, band in (("exact LAS", 1e-9), ("bands of 60 s", 60.0)):
        row = []
        for pin in range(0, 62, 2):
            r = run(FIRST, "goodput", pin=pin, band=band)
            row.append(f"{pin}:{r.mean_jct + TEARDOWN:.0f}/{r.restarts}" if r else f"{pin}:never")
        print(f"   {label}: " + " ".join(row))

    print("\n2. variations of the first mix (vs FIFO, vs Tiresias-like, moves)")
    rng = random.Random(1)
    kept = []
    for _ in range(400):
        mix = []
        for job, kind, steps, procs, at in FIRST:
            if rng.random() < 0.3 and procs != "2":
                procs = rng.choice(["1", "1:2"])
            if rng.random() < 0.3 and at > 0:
                at = rng.choice(range(10, 200, 10))
            mix.append((job, kind, steps, procs, at))
        mix.sort(key=lambda m: m[4])
        vf, vt, moves = verdict(mix)
        robust = min(verdict(mix, pin=p)[0] for p in (10.0, 20.0))
        if vf > 0.3 and vt > 0.15 and moves >= 9 and robust > 0.2:
            kept.append((moves, vf, vt, mix))
    kept.sort(key=lambda k: (-k[0], -k[1]))
    for moves, vf, vt, mix in kept[:6]:
        print(f"   {moves} moves, {vf:.1%} below FIFO, {vt:.1%} below Tiresias: "
              + ", ".join(f"{j} {p}@{a}" for j, _, _, p, a in mix))

    print("\n3. 30 perturbed simulations (rates and start-ups +-10%, arrivals +0-1 s)")
    for label, mix in (("first mix", FIRST), ("chosen mix", CHOSEN)):
        print(f"   {label}: " + robustness(mix, RATES, STARTUP))

    print("\n4. the chosen mix at the rates of 2026-12-02, steps scaled (the same 30 "
          "perturbations)")
    for scale in (1.0, 1.2, 1.3, 1.4, 1.5):
        mix = [(j.name, k, j.steps, p, a) for j, (_, k, _, p, a) in
               zip(sched_testbed.scaled(sched_testbed.JOBS, scale), CHOSEN, strict=True)]
        vf, vt, moves = verdict(mix, rates=RATES_DEC02, startup=STARTUP_DEC02)
        print(f"   --scale {scale}: unperturbed {moves} moves, {vf:.1%} below FIFO, "
              f"{vt:.1%} below Tiresias; " + robustness(mix, RATES_DEC02, STARTUP_DEC02))


def robustness(mix, base_rates, base_startup) -> str:
    """How often the three testbed targets hold over 30 perturbed simulations of `mix`:
    rates +-10%, start-ups -12% .. +28% (MNIST-1D) and -12% .. +22% (char-LM), arrivals
    +0-1 s."""
    results = []
    for seed in range(30):
        rnd = random.Random(seed)
        rates = {k: {p: v * rnd.uniform(0.9, 1.1) for p, v in r.items()}
                 for k, r in base_rates.items()}
        startup = {"m": base_startup["m"] * rnd.uniform(0.88, 1.28),
                   "c": base_startup["c"] * rnd.uniform(0.88, 1.22)}
        moved = [(j, k, s, p, a + rnd.uniform(0, 1)) for j, k, s, p, a in mix]
        results.append(verdict(moved, rates=rates, startup=startup))
    every = sum(vf >= 0.25 and vt >= 0.10 and n >= 10 for vf, vt, n in results)
    return (f"all three targets in {every}/30; >= 25% below FIFO in "
            f"{sum(vf >= 0.25 for vf, _, _ in results)}/30 (median "
            f"{statistics.median(vf for vf, _, _ in results):.1%}); >= 10 moves in "
            f"{sum(n >= 10 for _, _, n in results)}/30")


if __name__ == "__main__":
    main()
