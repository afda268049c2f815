"""Time-to-accuracy records (DAWNBench-style) for the examples, and the rule to claim one.

    python benchmarks/speedrun.py --task mnist1d --seeds 5              # record vs previous
    python benchmarks/speedrun.py --task char_lm --seeds 5 --ablations  # + one row per trick
    python benchmarks/speedrun.py --task mnist1d --seeds 5 --save NAME  # keep it if it wins

The protocol. Fixed data: MNIST-1D's standard split (4000 / 1000, as `mnist1d` makes it)
and the char-LM's corpus and split as `examples/char_lm.py` defines them. Every run is a
fresh `tandem run --nproc-per-node 2` of the example script with `--run.seed S`, one
thread per process; contenders are interleaved seed by seed (their order rotated) so
that machine load falls on all alike. Seeds are 0..N-1 for every contender.

A run's time-to-target is measured by tandem itself: from the start of training (the
first step; the process start, the data and the model build are start-up, reported
separately) to the END of the first evaluation that meets the target, every earlier
evaluation and checkpoint included (`time_to_target_end_s`). A second target's time
(MNIST-1D's 94%) comes from the same run's evaluations in the run store, whose times
are taken at the end of each evaluation. A seed that never meets the target scores
`MISS_PENALTY` x its whole training time in the test (as `tandem tune --hparams`
scores a miss) and infinity in the median.

The rule. The contender ("record": the example as shipped) becomes a record when,
over >= 5 seeds, a one-sided Welch t-test says its mean time-to-target is below the
previous record's with p < 0.01 (`speedrun_stats.py`), and every seed's final metric
(at the end of its whole schedule) clears the task's floor. The other contenders stop at
their target (`train.stop_at_target`): their time is the same, the benchmark shorter.
The previous record is re-run interleaved with it (same load), and its stored figures
are shown beside; the first record of a task is tested against the same recipe with
every trick off. Ablations: the record with one trick turned off (the flags of
`TRICKS`), one row each. Records, ablations and every run's
figures go to `benchmarks/speedrun_records.json` (with `--save`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from speedrun_stats import RECORD_P, welch_less  # noqa: E402

RECORDS = HERE / "speedrun_records.json"
MISS_PENALTY = 2.0
SLACK = 1e-6  # relative, as tandem's own target check (float32 means)


@dataclass(frozen=True)
class Goal:
    """A task's targets, the final-metric floor every seed must clear, and its script."""

    script: str
    metric: str  # as the run store names it
    op: str  # ">=" or "<="
    target: float  # the record's target (train.target of the script)
    extra: tuple[float, ...]  # further targets timed from the same runs
    floor: float  # every seed's final metric must be at least this good

    def met(self, value: float, goal: float) -> bool:
        slack = SLACK * max(1.0, abs(goal))
        return value >= goal - slack if self.op == ">=" else value <= goal + slack


GOALS = {
    "mnist1d": Goal("examples/mnist1d_cnn.py", "accuracy", ">=", 0.99, (0.94,), 0.988),
    "char_lm": Goal("examples/char_lm.py", "eval_loss", "<=", 2.3, (), 2.3),
}

# The record's tricks, each with the flags that turn it off (its ablation row).
TRICKS: dict[str, dict[str, list[str]]] = {
    "mnist1d": {
        "muon": ["--optimizer", "adamw"],
        "ema": ["--train.ema_decay", "0"],
        "in_memory": ["--data.in_memory", "false"],
        "short_schedule": ["--train.steps", "1000", "--optim.warmup_steps", "50"],
        "shared_memory": ["--plan.host_allreduce", "backend"],
    },
    "char_lm": {
        "muon": ["--optimizer", "adamw"],
        "seq_ramp": ["--train.seq_ramp", ""],
        "bf16": ["--precision.mode", "fp32"],
        "short_schedule": ["--train.steps", "300", "--optim.warmup_steps", "30"],
        "late_evals": ["--train.eval_from", "0"],
        "in_memory": ["--data.in_memory", "false"],
        "shared_memory": ["--plan.host_allreduce", "backend"],
        "fp32_attention": ["--precision.attention", "autocast"],
    },
}
# Options added after some records were set, and the value those records ran with:
# re-running an older record must not hand it what came later (a record saved since
# lists them in its `options_known`).
BEFORE_OPTION = {"--plan.host_allreduce": "backend", "--precision.attention": "autocast"}


def loadavg() -> float:
    """The 1-minute load average (other engineers share this machine)."""
    return os.getloadavg()[0]


def wait_for_quiet(limit: float, max_wait_s: float, poll_s: float = 60.0) -> float:
    """Poll the load average until it is below `limit` or `max_wait_s` passed; return it."""
    deadline = time.monotonic() + max_wait_s
    while (load := loadavg()) >= limit and time.monotonic() < deadline:
        print(f"  load {load:.2f} >= {limit}: waiting", flush=True)
        time.sleep(poll_s)
    return loadavg()


def child_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path, PYTHONUNBUFFERED="1")


def run_one(goal: Goal, flags: list[str], seed: int, out: Path, name: str,
            timeout: float, nproc: int = 2) -> dict[str, Any]:
    """One fresh run of the script; its timings and final metric (None where it failed)."""
    cmd = [sys.executable, "-m", "tandem.cli", "run", "--nproc-per-node", str(nproc),
           str(ROOT / goal.script), "--run.dir", str(out), "--run.name", name,
           "--run.seed", str(seed), "--monitor.progress", "off", *flags]
    load = loadavg()
    launched = time.time()
    with open(out / f"{name}.log", "w") as log:
        try:
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env(),
                                  cwd=ROOT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = -1
    row: dict[str, Any] = {"seed": seed, "exit": code, "load": round(load, 2)}
    summary_path = out / name / "summary.json"
    if code != 0 or not summary_path.is_file():
        return {**row, "error": (out / f"{name}.log").read_text()[-800:]}
    summary = json.loads(summary_path.read_text())
    started = summary["train_started_at"]
    evals = _evaluations(out / "tandem.db", name, goal.metric)
    row.update({
        "startup_s": round(started - launched, 3),
        "train_s": round(summary["wall_time_s"], 3),
        "final": summary.get(goal.metric),
        "steps": summary["steps"],
        "evaluations": len(evals),
    })
    for target in (goal.target, *goal.extra):
        hit = next(((step, at) for step, value, at in evals if goal.met(value, target)), None)
        row[f"t_{target:g}"] = round(hit[1] - started, 3) if hit else None
        row[f"step_{target:g}"] = hit[0] if hit else None
    # tandem's own clock for the main target (the store's times agree to a few ms).
    row["time_s"] = summary.get("time_to_target_end_s")
    return row


def _evaluations(store: Path, name: str, metric: str) -> list[tuple[int, float, float]]:
    """(step, value, time.time() at the end of the evaluation) of the run's evaluations."""
    with sqlite3.connect(store) as db:
        (run_id,) = db.execute("SELECT run_id FROM runs WHERE name = ? ORDER BY started DESC "
                               "LIMIT 1", (name,)).fetchone()
        return db.execute("SELECT step, value, time FROM metrics WHERE run_id = ? AND rank = -1 "
                          "AND name = ? ORDER BY step", (run_id, metric)).fetchall()


def scored(row: dict[str, Any]) -> float:
    """A seed's value in the test: its time, or MISS_PENALTY x its training time."""
    if row.get("time_s") is not None:
        return float(row["time_s"])
    return MISS_PENALTY * float(row.get("train_s") or math.inf)


def figures(rows: list[dict[str, Any]], goal: Goal) -> dict[str, Any]:
    """Median, spread and per-seed values of one contender's runs."""
    ok = [r for r in rows if "error" not in r]
    times = [r["time_s"] if r.get("time_s") is not None else math.inf for r in ok]
    out: dict[str, Any] = {
        "seeds": len(rows), "failed": len(rows) - len(ok),
        "median_s": statistics.median(times) if times else None,
        "min_s": min(times) if times else None, "max_s": max(times) if times else None,
        "per_seed_s": times,
        "reached": sum(1 for t in times if math.isfinite(t)),
        "startup_median_s": statistics.median([r["startup_s"] for r in ok]) if ok else None,
        "final": [r["final"] for r in ok],
        "floor_met": bool(ok) and all(r["final"] is not None and goal.met(r["final"], goal.floor)
                                      for r in ok),
        "load_median": statistics.median([r["load"] for r in rows]) if rows else None,
    }
    for target in goal.extra:
        extra = [r.get(f"t_{target:g}") for r in ok]
        extra = [t if t is not None else math.inf for t in extra]
        out[f"median_{target:g}_s"] = statistics.median(extra) if extra else None
        out[f"per_seed_{target:g}_s"] = extra
    return out


def verdict(new: list[dict[str, Any]], old: list[dict[str, Any]], goal: Goal) -> dict[str, Any]:
    """Whether `new` is a record over `old` by the rule (Welch p < RECORD_P, floors)."""
    a = [scored(r) for r in new if "error" not in r]
    b = [scored(r) for r in old if "error" not in r]
    if len(a) < 2 or len(b) < 2 or not all(map(math.isfinite, a + b)):
        return {"p": None, "record": False, "why": "too few finished runs to test"}
    test = welch_less(a, b)
    floors = figures(new, goal)["floor_met"]
    record = test.p < RECORD_P and floors and len(a) >= 5
    why = (f"Welch t = {test.t:.2f}, df = {test.df:.1f}, one-sided p = {test.p:.2g} "
           f"({test.source}); floor {'met' if floors else 'missed'} on every seed")
    return {"p": test.p, "t": test.t, "df": test.df, "record": record, "why": why}


def previous_record(task: str) -> dict[str, Any] | None:
    """The latest accepted record of `task` in the records file."""
    if not RECORDS.is_file():
        return None
    records = json.loads(RECORDS.read_text()).get(task, {}).get("records", [])
    return records[-1] if records else None


def show(name: str, fig: dict[str, Any], goal: Goal) -> str:
    def s(x: float | None) -> str:
        return "miss" if x is None or not math.isfinite(x) else f"{x:.2f}"

    seeds = " ".join(s(t) for t in fig["per_seed_s"])
    extra = "".join(f"  to {t:g}: {s(fig[f'median_{t:g}_s'])} s" for t in goal.extra)
    finals = " ".join(f"{v:.4f}" for v in fig["final"] if v is not None)
    return (f"{name:>22}: median {s(fig['median_s'])} s [{s(fig['min_s'])}-{s(fig['max_s'])}]"
            f"{extra}  seeds [{seeds}]  final [{finals}]  start-up "
            f"{s(fig['startup_median_s'])} s  load {fig['load_median']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(GOALS), required=True)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--ablations", action="store_true", help="one row per trick, off")
    parser.add_argument("--only", default="", help="comma-separated tricks to ablate")
    parser.add_argument("--no-previous", action="store_true",
                        help="do not re-run the previous record")
    parser.add_argument("--flags", default="", help="extra flags for the record's runs")
    parser.add_argument("--save", default="", help="name the record and store it if it wins")
    parser.add_argument("--quiet-load", type=float, default=1.0)
    parser.add_argument("--max-wait", type=float, default=0.0,
                        help="seconds to wait for load < --quiet-load before each seed")
    parser.add_argument("--full-runs", action="store_true",
                        help="run every contender to its last step (default: all but the "
                             "record stop at the target, train.stop_at_target)")
    parser.add_argument("--nproc", type=int, default=2,
                        help="processes per run (records are kept at 2 only: other counts "
                             "check that the recipe runs unchanged there)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--out", default="", help="where runs go (default: a temp dir)")
    ns = parser.parse_args(argv)
    if ns.save and ns.nproc != 2:
        parser.error(f"--save keeps records of 2-process runs; --nproc {ns.nproc} only checks")
    goal = GOALS[ns.task]
    previous = previous_record(ns.task)
    contenders: dict[str, list[str]] = {"record": shlex.split(ns.flags)}
    if previous is not None and not ns.no_previous:
        flags = list(previous["flags"])
        for option, then in BEFORE_OPTION.items():
            if option not in flags and option not in previous.get("options_known", ()):
                flags += [option, then]
        contenders["previous"] = flags
    elif not ns.no_previous:  # the first record: against the recipe with every trick off
        contenders["previous"] = [*contenders["record"],
                                  *(f for off in TRICKS[ns.task].values() for f in off)]
    if ns.ablations or ns.only:
        wanted = set(ns.only.split(",")) if ns.only else set(TRICKS[ns.task])
        for trick, off in TRICKS[ns.task].items():
            if trick in wanted:
                contenders[f"without {trick}"] = [*contenders["record"], *off]
    if not ns.full_runs:  # the record runs its whole schedule: its final metric counts
        for name in contenders:
            if name != "record":
                contenders[name] = [*contenders[name], "--train.stop_at_target", "true"]
    out = Path(ns.out or tempfile.mkdtemp(prefix=f"speedrun-{ns.task}-"))
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    names = list(contenders)
    print(f"{ns.task}: {len(names)} contenders x {ns.seeds} seeds, runs in {out}", flush=True)
    for seed in range(ns.seeds):
        if ns.max_wait:
            wait_for_quiet(ns.quiet_load, ns.max_wait)
        order = names[seed % len(names):] + names[:seed % len(names)]
        for name in order:
            tag = f"{name.replace(' ', '-')}-s{seed}"
            row = run_one(goal, contenders[name], seed, out, tag, ns.timeout, ns.nproc)
            rows[name].append(row)
            print(f"  seed {seed} {name}: time {row.get('time_s')} final {row.get('final')} "
                  f"start-up {row.get('startup_s')} load {row['load']}"
                  + (f" ERROR {row['error'][-300:]}" if "error" in row else ""), flush=True)
    return report(ns, goal, contenders, rows, previous)


def report(ns: argparse.Namespace, goal: Goal, contenders: dict[str, list[str]],
           rows: dict[str, list[dict[str, Any]]], previous: dict[str, Any] | None) -> int:
    figs = {name: figures(r, goal) for name, r in rows.items()}
    print(f"\n{ns.task}: time from the start of training to the end of the first evaluation "
          f"with {goal.metric} {goal.op} {goal.target:g} ({ns.nproc} processes, {ns.seeds} seeds)")
    for name, fig in figs.items():
        print(show(name, fig, goal))
    result: dict[str, Any] = {}
    if "previous" in rows:
        result = verdict(rows["record"], rows["previous"], goal)
        label = previous["name"] if previous else "every trick off"
        print(f"record vs previous ({label}): {result['why']}"
              f" -> {'NEW RECORD' if result['record'] else 'not a record'}")
        if previous is not None:
            print(f"previous as stored: median {previous['figures']['median_s']} s, load "
                  f"{previous['figures']['load_median']}")
    for name in rows:
        if name.startswith("without "):
            v = verdict(rows["record"], rows[name], goal)
            figs[name]["p_record_faster"] = v["p"]
            print(f"{name}: record faster with p = {v['p']}")
    if ns.save:
        save(ns, contenders, rows, figs, result, previous)
    return 0


def save(ns: argparse.Namespace, contenders: dict[str, list[str]],
         rows: dict[str, list[dict[str, Any]]], figs: dict[str, dict[str, Any]],
         result: dict[str, Any], previous: dict[str, Any] | None) -> None:
    """Store the runs; the contender as a new record only if the rule says so."""
    data = json.loads(RECORDS.read_text()) if RECORDS.is_file() else {}
    task = data.setdefault(ns.task, {"records": [], "attempts": []})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    entry = {
        "name": ns.save, "date": datetime.date.today().isoformat(), "commit": commit,
        "flags": contenders["record"], "options_known": sorted(BEFORE_OPTION),
        "figures": figs["record"], "runs": rows["record"],
        "versus": previous["name"] if previous else "every trick off", "test": result,
        "ablations": {name: {"flags": contenders[name], "figures": figs[name],
                             "runs": rows[name]}
                      for name in rows if name.startswith("without ")},
        "previous_rerun": ({"figures": figs["previous"], "runs": rows["previous"]}
                           if "previous" in rows else None),
    }
    accepted = bool(result.get("record")) if "previous" in rows else previous is None
    task["records" if accepted else "attempts"].append(entry)
    RECORDS.write_text(json.dumps(_clean(data), indent=1) + "\n")
    print(f"saved to {RECORDS} as {'a record' if accepted else 'an attempt'}")


def _clean(value: Any) -> Any:
    """JSON without Infinity: a missed target is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


if __name__ == "__main__":
    raise SystemExit(main())
