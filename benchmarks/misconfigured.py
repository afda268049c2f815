"""The tuner on deliberately mis-configured jobs, and on well-configured ones.

Every job is benchmarks/misconfigured_task.py (or the tuner's test job) with settings
that are wrong in exactly one way, or right. For each mis-configured job the benchmark

1. runs `tandem tune` on it (a real session: its own placebo, controls and trials),
2. measures the plan it adopted against the job's own plan SIDE BY SIDE: `--pairs`
   pairs of fresh runs, interleaved with alternating order (AB, BA, ...), the run as the
   unit (the ratio of each pair, a Student-t interval over the pairs, df = pairs - 1,
   nothing shared with the tuner's own runs),

and prints the measured ratio with its interval next to the tuner's claimed one. For the
well-configured jobs it runs `--well-sessions` sessions (round robin over the jobs) and
counts the adoptions. Figures: steady samples/s over wall time (`stats.run_rates`), as the
tuner measures them.

    python benchmarks/misconfigured.py                      # everything (hours under load)
    python benchmarks/misconfigured.py --jobs accumulation,threads --well-sessions 0
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.monitor.store import RunStore
from tandem.tune import space
from tandem.tune import stats as tstats
from tandem.tune.trial import RunOutcome, TrialRunner

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "benchmarks" / "misconfigured_task.py"
SMALL = ROOT / "tests" / "dist" / "scripts" / "tune_task.py"


@dataclass(frozen=True)
class Job:
    """One job: a script, its flags and environment, and what is wrong with it."""

    what: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    script: Path = TASK
    nproc: int = 2
    well: bool = False


JOBS: dict[str, Job] = {
    "accumulation": Job("micro-batch 4 under a global batch of 128 on 2 processes: 16 "
                        "accumulation passes a step with memory to spare",
                        ["--train.global_batch", "128", "--train.micro_batch", "4"]),
    "loader": Job("2 ms to load a sample (waiting on storage), no loader workers",
                  ["--train.global_batch", "64", "--data.workers", "0"],
                  {"MC_LOAD_MS": "2"}),
    "eval-cadence": Job("evaluates 2048 samples every 2 steps",
                        ["--train.global_batch", "64", "--train.eval_every", "2"],
                        {"MC_EVAL_N": "2048"}),
    "bucket": Job("192 layers of 128 (12.6 MB of gradient) in 0.02 MiB DDP buckets: one "
                  "all-reduce per layer",
                  ["--train.global_batch", "64", "--plan.bucket_mb", "0.02"],
                  {"MC_WIDTH": "128", "MC_DEPTH": "192"}),
    "threads": Job("4 threads per process, 2 processes, 2 cores",
                   ["--train.global_batch", "128"], {"OMP_NUM_THREADS": "4",
                                                     "MC_WIDTH": "1024"}),
    "well-mlp": Job("an MLP whose settings fit the machine", ["--train.global_batch", "256"],
                    {"MC_IN": "512", "MC_WIDTH": "1024", "MC_DEPTH": "2"}, well=True),
    "well-small": Job("the tuner's small job, one process, no loading cost", [],
                      {"TUNE_TASK_SLEEP_MS": "0"}, script=SMALL, nproc=1, well=True),
    "well-mnist1d": Job("the MNIST-1D example as its README runs it", [], {},
                        script=ROOT / "examples" / "mnist1d_cnn.py", well=True),
    "well-char-lm": Job("the char-LM example as its README runs it", [], {},
                        script=ROOT / "examples" / "char_lm.py", well=True),
}


def _env(job: Job) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", **job.env}
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TANDEM_PLAN"):
        env.pop(key, None)
    return env


def tune(job: Job, work: Path, ns: argparse.Namespace, budget: str) -> dict[str, Any]:
    """One `tandem tune` session of `job`; its summary, plan and wall time."""
    work.mkdir(parents=True, exist_ok=True)
    store = work / "tandem.db"
    cmd = [sys.executable, "-m", "tandem.cli", "tune", "--nproc-per-node", str(job.nproc),
           "--budget", budget, "--max-trials", str(ns.max_trials), "--steps", str(ns.steps),
           "--log-every", str(ns.log_every), "--store", str(store), "--work-dir",
           str(work / "trials"), "--out", str(work / "plan.toml"), str(job.script), *job.args]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=work, env=_env(job), capture_output=True, text=True)
    (work / "tune.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return {"error": (proc.stdout + proc.stderr)[-1500:], "wall_s": time.monotonic()
                - started}
    with RunStore(store) as db:
        session = [r for r in db.runs() if "tune" in (r["config"] or {})][-1]
    plan = space.flatten(tomllib.loads((work / "plan.toml").read_text()))
    return {"session": session["run_id"], "summary": session["summary"], "plan": plan,
            "wall_s": time.monotonic() - started, "store": str(store)}


def side_by_side(job: Job, plan: dict[str, Any], work: Path, ns: argparse.Namespace
                 ) -> dict[str, Any]:
    """Interleaved pairs of the job's plan and `plan`: ratio with its t-interval."""
    runner = TrialRunner(str(job.script), list(job.args), job.nproc, work / "side",
                         work / "side.db", env={"OMP_NUM_THREADS": "1", **job.env})
    logs, a_rates, b_rates, failed = [], [], [], []
    for i in range(ns.pairs):
        order = [("a", {}), ("b", plan)] if i % 2 == 0 else [("b", plan), ("a", {})]
        runs: dict[str, RunOutcome] = {}
        for who, changes in order:
            runs[who] = runner.run(f"side-{i}-{who}", changes, ns.steps, ns.log_every)
        if not (runs["a"].ok and runs["b"].ok):
            failed += [r.error for r in runs.values() if not r.ok]
            continue
        a, b = runs["a"].figures.get("wall"), runs["b"].figures.get("wall")
        if a and b:
            a_rates.append(a)
            b_rates.append(b)
            logs.append(math.log(b / a))
    out: dict[str, Any] = {"pairs": len(logs), "failed": failed,
                           "original": a_rates, "adopted": b_rates}
    if len(logs) >= 2:
        iv = tstats.mean_interval(logs)
        out["ratio"] = {"estimate": math.exp(iv.estimate), "low": math.exp(iv.low),
                        "high": math.exp(iv.high), "n": iv.n}
    return out


def _iv(d: dict[str, Any] | None) -> str:
    if not d:
        return "-"
    return f"{d['estimate']:.2f} [{d['low']:.2f}, {d['high']:.2f}]"


def run_misconfigured(names: list[str], root: Path, ns: argparse.Namespace) -> list[dict]:
    rows = []
    for name in names:
        job = JOBS[name]
        print(f"\n== {name}: {job.what}", flush=True)
        session = tune(job, root / name, ns, ns.budget)
        row: dict[str, Any] = {"job": name, "what": job.what, **session}
        if "error" not in session and session["plan"]:
            row["side"] = side_by_side(job, session["plan"], root / name, ns)
        claim = (session.get("summary") or {}).get("speedup")
        measured = (row.get("side") or {}).get("ratio")
        row["covered"] = bool(claim and measured
                              and claim["low"] <= measured["estimate"] <= claim["high"])
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("summary",)},
                         default=str)[:2000], flush=True)
        (root / "results.json").write_text(json.dumps(rows, indent=1, default=str))
    return rows


def run_well(sessions: int, root: Path, ns: argparse.Namespace) -> list[dict]:
    names = ns.well_jobs.split(",") if ns.well_jobs else [n for n, j in JOBS.items()
                                                            if j.well]
    rows = []
    for i in range(sessions):
        name = names[i % len(names)]
        print(f"\n== well-configured session {i + 1}/{sessions}: {name}", flush=True)
        session = tune(JOBS[name], root / f"well-{i}-{name}", ns, ns.well_budget)
        summary = session.get("summary") or {}
        rows.append({"job": name, "session": session.get("session"),
                     "plan": session.get("plan"), "error": session.get("error"),
                     "wall_s": session.get("wall_s"), "runs": summary.get("runs"),
                     "trials": summary.get("trials"), "tried": tried(session),
                     "load": os.getloadavg()[0], "noise": summary.get("noise")})
        print(json.dumps(rows[-1], default=str)[:1200], flush=True)
        (root / "well.json").write_text(json.dumps(rows, indent=1, default=str))
    return rows


def tried(session: dict[str, Any]) -> list[str]:
    """The candidates a session ran pairs of: 'label: status (measured ratio)'."""
    if not session.get("store") or not session.get("session"):
        return []
    with RunStore(Path(session["store"])) as db:
        trials = db.trials(session["session"])
    out = []
    for t in trials:
        fig = t.get("figures") or {}
        if fig.get("kind") in ("candidate", "control") and t["status"] != "not-reached":
            ratio = (fig.get("ratio") or {}).get("estimate")
            out.append(f"{fig.get('label')}: {t['status']}"
                       + (f" ({ratio:.3g}x)" if ratio else ""))
    return out


def report(rows: list[dict], well: list[dict]) -> None:
    print("\n| job | what is wrong | adopted | claimed [95% CI] | measured side by side "
          "[95% CI] | covered | tuning s | runs |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        summary = r.get("summary") or {}
        plan = ", ".join(f"{k}={v}" for k, v in (r.get("plan") or {}).items()) or (
            "error" if r.get("error") else "nothing")
        side = r.get("side") or {}
        print(f"| {r['job']} | {r['what']} | {plan} | {_iv(summary.get('speedup'))} | "
              f"{_iv(side.get('ratio'))} ({side.get('pairs', 0)} pairs) | "
              f"{'yes' if r['covered'] else 'no'} | {r.get('wall_s', 0):.0f} | "
              f"{summary.get('runs', '-')} |")
    if well:
        adopted = [w for w in well if w.get("plan")]
        print(f"\nwell-configured: {len(adopted)} adoption(s) in {len(well)} sessions")
        for w in well:
            noise = w.get("noise") or {}
            print(f"  {w['job']}: {w.get('plan') or 'kept'}; placebo "
                  f"{_iv(noise.get('placebo'))}, {w.get('runs')} runs, "
                  f"{(w.get('wall_s') or 0):.0f} s, load {w.get('load', 0):.1f}; tried: "
                  f"{'; '.join(w.get('tried') or []) or 'nothing'}"
                  + (f"; ERROR {w['error'][-200:]}" if w.get("error") else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default=",".join(n for n, j in JOBS.items() if not j.well))
    parser.add_argument("--well-sessions", type=int, default=10)
    parser.add_argument("--budget", default="25m", help="per mis-configured session")
    parser.add_argument("--well-budget", default="8m", help="per well-configured session")
    parser.add_argument("--well-jobs", default="",
                        help="well-configured jobs, round robin (default: all of them)")
    parser.add_argument("--max-trials", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=4, help="side-by-side pairs")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    parser.add_argument("--busy-core", action="store_true",
                        help="keep one core busy with a spinning process throughout")
    ns = parser.parse_args()
    root = Path(ns.dir or tempfile.mkdtemp(prefix="tandem-misconfigured-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    print(f"work directory {root}; load average {os.getloadavg()}", flush=True)
    names = [n for n in ns.jobs.split(",") if n]
    unknown = [n for n in names + [w for w in ns.well_jobs.split(",") if w]
               if n not in JOBS]
    if unknown:
        raise SystemExit(f"unknown job(s) {unknown}; known: {', '.join(JOBS)}")
    busy = (subprocess.Popen([sys.executable, "-c", "while True: pass"])
            if ns.busy_core else None)
    try:
        rows = run_misconfigured(names, root, ns)
        well = run_well(ns.well_sessions, root, ns)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    report(rows, well)
    print(f"\nload average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
