"""The live scheduler on this machine: 8 real jobs under each policy, then the simulator's
prediction of the same testbed from the throughputs the jobs measured.

Each policy in turn gets a fresh store and `tandem scheduler --backend local --slots 2`;
the 8 jobs (examples/mnist1d_cnn.py and examples/char_lm.py as testbed jobs that log
their sample ids, different lengths, some elastic 1:2) are submitted at fixed offsets.
Printed per policy: mean job completion time, makespan, resizes and preemptions, resize
latency (decision to the resumed run's 'resume' event), steps redone, and the audit of
every job's sample ids against the global order. Then `tandem.sched.simulate` replays
each policy on the same jobs (per-job samples/s measured at 1 and 2 processes, the
start-up measured for each kind of job, launch to its training loop's 'segment' event, as
its restart delay, the measured teardown added to each job), and its mean JCT is set
beside the testbed's.

    python benchmarks/sched_testbed.py                      # fifo, tiresias, goodput
    python benchmarks/sched_testbed.py --policies goodput --out /tmp/testbed
    python benchmarks/sched_testbed.py --replay /tmp/testbed/results.json   # simulate only
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tandem.monitor.store import RunStore  # noqa: E402
from tandem.sched import POLICIES, Cluster, JobSpec, simulate  # noqa: E402
from tandem.sched.policies.pinning import Pinned  # noqa: E402
from tandem.sched.service.jobstore import SchedStore  # noqa: E402
from tandem.sched.service.measured import read  # noqa: E402
from tandem.sched.service.records import DONE  # noqa: E402
from tandem.sched.service.sample_audit import audit, read_logs  # noqa: E402
from tandem.sched.service.submit import SubmitRequest, submit  # noqa: E402
from tandem.sched.simulation.measured_app import MeasuredApplication  # noqa: E402

JOBS_DIR = ROOT / "benchmarks" / "sched_jobs"
MNIST = (str(JOBS_DIR / "mnist1d_ids.py"), 128, 4000)  # script, global batch, train samples
CHAR = (str(JOBS_DIR / "char_lm_ids.py"), 32, None)  # samples: counted at audit time


@dataclass(frozen=True)
class TestbedJob:
    name: str
    kind: tuple[str, int, int | None]
    steps: int
    procs: str
    at: float
    """Seconds after the start at which the job is submitted."""


JOBS = [  # how this mix was chosen: benchmarks/sched_testbed_mix.py
    TestbedJob("mnist-long", MNIST, 3600, "1:2", 0),
    TestbedJob("charlm-a", CHAR, 144, "1:2", 10),
    TestbedJob("mnist-rigid", MNIST, 1000, "2", 20),
    TestbedJob("charlm-b", CHAR, 96, "1", 40),
    TestbedJob("mnist-mid", MNIST, 1600, "1:2", 80),
    TestbedJob("mnist-tiny", MNIST, 480, "1", 100),
    TestbedJob("charlm-c", CHAR, 96, "1:2", 110),
    TestbedJob("mnist-short", MNIST, 600, "1:2", 190),
]
MIN_RUN = 15.0
SERVICE_FLAGS = ("--backend", "local", "--slots", "2", "--interval", "2", "--poll", "0.3",
                 "--min-run", str(MIN_RUN))
POLICY_FLAGS = {"tiresias": ("--las-threshold", "60")}


def scaled(jobs: list[TestbedJob], scale: float) -> list[TestbedJob]:
    """The testbed with every job's steps times `scale` (a quick check of the script)."""
    return [TestbedJob(j.name, j.kind, max(5, round(j.steps * scale)), j.procs, j.at)
            for j in jobs]


def run_policy(policy: str, out: Path, timeout: float) -> dict:
    """Run the testbed under one policy; returns its figures."""
    folder = out / policy
    store = folder / "runs" / "tandem.db"
    folder.mkdir(parents=True, exist_ok=False)
    env = dict(os.environ, TANDEM_STORE=str(store), OMP_NUM_THREADS="1")
    load_before = os.getloadavg()
    log = (folder / "service.log").open("wb")
    service = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", "scheduler", "--policy", policy,
         *SERVICE_FLAGS, *POLICY_FLAGS.get(policy, ())], env=env, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True)
    start = time.time()
    ids: dict[str, str] = {}
    try:
        for job in JOBS:
            time.sleep(max(0.0, start + job.at - time.time()))
            request = SubmitRequest(
                script=job.kind[0], args=["--train.steps", str(job.steps)], procs=job.procs,
                name=job.name, cwd=str(folder),
                env={"PYTHONPATH": str(ROOT / "src"), "TANDEM_SAMPLE_LOG": str(folder / "ids")})
            ids[job.name] = submit(request, store).job_id
        deadline = start + timeout
        while time.time() < deadline:
            with SchedStore(store) as sched:
                if all(j.state in DONE for j in sched.jobs()):
                    break
            if service.poll() is not None:
                raise RuntimeError(f"{policy}: the service exited ({service.returncode})")
            time.sleep(1.0)
        else:
            raise RuntimeError(f"{policy}: jobs unfinished after {timeout:.0f} s")
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=60)
        log.close()
    return collect(policy, store, folder, start, ids, load_before)


def collect(policy: str, store: Path, folder: Path, start: float, ids: dict[str, str],
            load_before: tuple[float, ...]) -> dict:
    """The figures of one policy's run, from its store and its jobs' id logs."""
    with SchedStore(store) as sched, RunStore(store) as runs:
        jobs = {j.name: j for j in sched.jobs()}
        resizes = sched.resizes()
        per_job, tails = {}, []
        starts: dict[str, list[float]] = {}
        for job in JOBS:
            record = jobs[job.name]
            attempts = sched.attempts(record.job_id)
            measured = read(runs, record.run_name)
            rates: dict[int, list[float]] = {}
            for attempt in attempts:
                windows = [w for w in measured.windows
                           if attempt.launched <= w.time <= (attempt.ended or 1e18)]
                began = measured.first_event("segment", attempt.launched)
                if began and began["time"] <= (attempt.ended or 1e18):
                    # launch to the training loop's start: the processes, imports, data,
                    # model, restore (the first window's steps are training, not start-up)
                    starts.setdefault(job.kind[0], []).append(
                        began["time"] - attempt.launched)
                if windows:
                    # the first window holds the first steps (warm-up, unless it is the
                    # only one)
                    rates.setdefault(attempt.procs, []).extend(
                        w.rate for w in windows[1:] or windows)
                    if attempt.outcome == "completed":
                        tails.append(attempt.ended - windows[-1].time)
            per_job[job.name] = {
                "state": record.state, "jct": (record.finished or 0) - record.submitted,
                "attempts": len(attempts),
                "rates": {p: statistics.median(v) for p, v in rates.items() if v}}
    kinds = [r["kind"] for r in resizes]
    latencies = [r["training_again"] - r["decided"] for r in resizes
                 if r["kind"] == "resize" and r.get("training_again")]
    redone = [r["steps_redone"] for r in resizes if r.get("steps_redone") is not None]
    audits = audit_jobs(folder, ids)
    jcts = [j["jct"] for j in per_job.values()]
    return {"policy": policy, "mean_jct": statistics.fmean(jcts),
            "makespan": max(j.finished for j in jobs.values()) - start,
            "resizes": kinds.count("resize"), "preemptions": kinds.count("preempt"),
            "recoveries": kinds.count("recover"), "resize_latencies": latencies,
            "steps_redone": redone, "startup_s": starts, "teardown_s": tails,
            "jobs": per_job, "audits": audits,
            "load": {"before": load_before, "after": os.getloadavg()}}


def audit_jobs(folder: Path, ids: dict[str, str]) -> dict[str, dict]:
    """Each job's sample ids (logged by its processes) against the global order."""
    audits = {}
    for job in JOBS:
        samples = job.kind[2] or char_samples()
        found = audit(read_logs(folder / "ids" / ids[job.name]), 0, samples)
        audits[job.name] = {"clean": found.clean, "samples": found.samples,
                            "expected": job.steps * job.kind[1], "repeated": found.repeated,
                            "skipped": found.skipped, "not_slices": found.not_slices}
    return audits


def reaudit(out: Path) -> None:
    """Audit an earlier run's sample logs again (the audit of this checkout), rewrite its
    results.json with the new audits and print its tables."""
    data = json.loads((out / "results.json").read_text())
    JOBS[:] = [TestbedJob(j["name"], tuple(j["kind"]), j["steps"], j["procs"], j["at"])
               for j in data["jobs"]]
    for result in data["results"]:
        folder = out / result["policy"]
        with SchedStore(folder / "runs" / "tandem.db") as sched:
            ids = {j.name: j.job_id for j in sched.jobs()}
        result["audits"] = audit_jobs(folder, ids)
    (out / "results.json").write_text(json.dumps(data, indent=2, default=str))
    print_tables(data["results"], data["predicted"])


_CHAR_SAMPLES: list[int] = []


def char_samples() -> int:
    """Training windows of the char_lm example (its corpus is this Python's stdlib)."""
    if not _CHAR_SAMPLES:
        sys.path.insert(0, str(ROOT / "examples"))
        import char_lm

        _CHAR_SAMPLES.append(len(char_lm.Windows("train")))
    return _CHAR_SAMPLES[0]


def measured_figures(results: list[dict]) -> tuple[dict, dict, float]:
    """Per job, samples/s at each size; per script, start-ups; the median teardown."""
    rates: dict[str, dict[int, list[float]]] = {}
    for result in results:
        for name, job in result["jobs"].items():
            for procs, rate in job["rates"].items():
                rates.setdefault(name, {}).setdefault(int(procs), []).append(rate)
    startups: dict[str, list[float]] = {}
    for result in results:
        for script, values in result["startup_s"].items():
            startups.setdefault(script, []).extend(values)
    teardown = statistics.median(t for r in results for t in r["teardown_s"])
    return ({name: {p: statistics.median(v) for p, v in by.items()} for name, by in
             rates.items()},
            {script: statistics.median(v) for script, v in startups.items()}, teardown)


def simulated(policy: str, jobs: list[TestbedJob], rates: dict, startups: dict,
              rng: random.Random | None = None):
    """The simulator on `jobs` with measured rates and start-ups (moved at random by
    rates +-10%, start-ups -10% .. +20%, arrivals +0-1 s when `rng` is given)."""
    def moved(low: float, high: float) -> float:
        return rng.uniform(low, high) if rng else 1.0

    apps, specs = {}, []
    for job in jobs:
        apps[job.name] = MeasuredApplication(
            job.name, job.kind[1], job.steps,
            {p: r * moved(0.9, 1.1) for p, r in rates[job.name].items()})
        low, _, high = job.procs.partition(":")
        late = rng.uniform(0.0, 1.0) if rng else 0.0
        specs.append(JobSpec(job_id=job.name, submit_time=job.at + late,
                             min_procs=int(low), max_procs=int(high or low),
                             batch_size=job.kind[1], limits=apps[job.name].limits,
                             application=job.name))
    inner = (POLICIES["tiresias"](thresholds=(60.0,)) if policy == "tiresias"
             else POLICIES[policy]())
    return simulate(specs, apps, Pinned(inner, MIN_RUN), Cluster(nodes=1, slots_per_node=2),
                    interval=2.0, restart_delays={
                        job.name: startups[job.kind[0]] * moved(0.9, 1.2) for job in jobs})


def predict(results: list[dict]) -> dict[str, float]:
    """The simulator's mean JCT of each policy on the same jobs, from measured figures."""
    rates, startups, teardown = measured_figures(results)
    return {r["policy"]: simulated(r["policy"], JOBS, rates, startups).mean_jct + teardown
            for r in results}


def replay(path: Path, scales: list[float], perturbed: int = 20) -> None:
    """How many resizes and preemptions the testbed would see with every job's steps
    scaled, simulated at the rates and start-ups an earlier run measured (`path`, its
    results.json), unmoved and in `perturbed` moved simulations."""
    rates, startups, teardown = measured_figures(json.loads(path.read_text())["results"])
    policies = ("fifo", "tiresias", "goodput")
    print(f"the simulator at the rates of {path}, steps scaled from this script's mix")
    for scale in scales:
        jobs = scaled(JOBS, scale)
        runs = [{p: simulated(p, jobs, rates, startups, rng) for p in policies}
                for rng in [None, *(random.Random(seed) for seed in range(perturbed))]]
        held = 0
        for sims in runs[1:]:
            jct = {p: s.mean_jct + teardown for p, s in sims.items()}
            moves = sum(s.resizes + s.preemptions for s in sims.values())
            held += (moves >= 10 and jct["goodput"] <= 0.75 * jct["fifo"]
                     and jct["goodput"] <= 0.9 * jct["tiresias"])
        first = runs[0]
        print(f"  --scale {scale}: " + ", ".join(
            f"{p} {s.mean_jct + teardown:.0f} s / {s.resizes + s.preemptions} moves"
            for p, s in first.items())
            + f"; {sum(s.resizes + s.preemptions for s in first.values())} moves in all; "
            f">= 10 moves and both JCT targets in {held}/{perturbed} moved simulations")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policies", nargs="+", default=["fifo", "tiresias", "goodput"],
                        choices=sorted(POLICIES))
    parser.add_argument("--out", type=Path, default=Path(f"/tmp/sched-testbed-{os.getpid()}"))
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds one policy's testbed may take")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every job's steps (0.1: a quick check of the "
                        "script; 1.4: the mix at this machine's rates of 2026-12-02, "
                        "benchmarks/sched_testbed_mix.py)")
    parser.add_argument("--replay", type=Path, metavar="RESULTS_JSON",
                        help="simulate only: the mix with its steps scaled by each of "
                        "--scales, at the rates an earlier run measured")
    parser.add_argument("--scales", default="1.0,1.2,1.4,1.6,1.7,1.8")
    parser.add_argument("--reaudit", type=Path, metavar="OUT",
                        help="audit an earlier run's sample logs again (its --out folder)")
    ns = parser.parse_args()
    if ns.reaudit:
        reaudit(ns.reaudit)
        return
    if ns.replay:
        replay(ns.replay, [float(s) for s in ns.scales.split(",")])
        return
    JOBS[:] = scaled(JOBS, ns.scale)
    results = []
    ns.out.mkdir(parents=True, exist_ok=True)
    for policy in ns.policies:
        print(f"{policy}: running 8 jobs (load {os.getloadavg()[0]:.2f}) ...", flush=True)
        results.append(run_policy(policy, ns.out, ns.timeout))
        r = results[-1]
        (ns.out / f"{policy}.json").write_text(json.dumps(r, indent=2, default=str))
        print(f"{policy}: mean JCT {r['mean_jct']:.1f} s, makespan {r['makespan']:.1f} s, "
              f"{r['resizes']} resizes, {r['preemptions']} preemptions, load "
              f"{r['load']['before'][0]:.2f} -> {r['load']['after'][0]:.2f}", flush=True)
    predicted = predict(results)
    (ns.out / "results.json").write_text(json.dumps(
        {"results": results, "predicted": predicted, "jobs": [j.__dict__ for j in JOBS]},
        indent=2, default=str))
    print_tables(results, predicted)
    print(f"figures: {ns.out / 'results.json'}")


def print_tables(results: list[dict], predicted: dict[str, float]) -> None:
    """The summary table (markdown) and the checks."""
    print("\n| policy | mean JCT s | makespan s | resizes | preemptions | median resize "
          "latency s | steps redone | samples audit | simulator mean JCT s | error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        lat = f"{statistics.median(r['resize_latencies']):.1f}" if r["resize_latencies"] else "-"
        clean = all(a["clean"] and a["samples"] == a["expected"] for a in r["audits"].values())
        sim = predicted[r["policy"]]
        print(f"| {r['policy']} | {r['mean_jct']:.1f} | {r['makespan']:.1f} | {r['resizes']} | "
              f"{r['preemptions']} | {lat} | {sum(r['steps_redone'])} | "
              f"{'clean' if clean else 'NOT CLEAN'} | {sim:.1f} | "
              f"{(sim - r['mean_jct']) / r['mean_jct']:+.1%} |")
    moves = sum(r["resizes"] + r["preemptions"] for r in results)
    print(f"resizes + preemptions over all policies: {moves}")
    by = {r["policy"]: r["mean_jct"] for r in results}
    if "goodput" in by:
        for other in ("fifo", "tiresias"):
            if other in by:
                print(f"goodput mean JCT vs {other}: {1 - by['goodput'] / by[other]:.1%} lower")


if __name__ == "__main__":
    main()
