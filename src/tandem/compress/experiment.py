"""`tandem compress RUN --budget POINTS --out DIR`: weigh compressed versions of a trained
run's model against the original, and adopt the smallest (or fastest) within the budget.

The run's model is rebuilt from its script's `Task` (the script the run store recorded, or
`--script`; the script is imported, not run: its `if __name__ == "__main__"` part does not
execute) and loaded from the run's newest good checkpoint (its weight average when the run
kept one: the weights it evaluated). The original is the control: it and every candidate
(`candidates`) are measured alike (`measure`): the task's metric on its evaluation data,
weight elements, serialised bytes, CPU latency at batch 1 and 64. A candidate is eligible
when its metric is at most POINTS worse than the original's (`goal_of`: percentage points
for a metric that goes up, a fraction such as accuracy; the metric's own units for one that
goes down, such as a loss in nats) and it is smaller or
faster (at both batch sizes) than the original; the smallest eligible one is adopted
(`--prefer speed`: the fastest at batch 64). None eligible: the original is kept, and
`compress.json` says why. With POINTS 0 (a placebo) only a candidate no worse than the
original can be adopted.

DIR/model.pt2 is the adopted model as a `torch.export` program with a dynamic batch
dimension (`torch.export.load(path).module()(x)`, no tandem needed); DIR/compress.json
holds every candidate's figures, the choice and, for each one not adopted, why. Where the
run store holds the run, the same figures go into it as the run's trials
(`analyze.report.compression`): its report and the dashboard draw the trade-off.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import nn

from tandem.compress import quant
from tandem.compress.candidates import FINETUNED, FineTune, candidates
from tandem.compress.measure import (
    BATCHES,
    LOSS,
    collate_of,
    evaluate,
    latencies,
    model_inputs,
    state_bytes,
    weights,
)
from tandem.config.values import parse_target
from tandem.task import Task, module_task
from tandem.tune.stats import mean_interval

ORIGINAL = "original"
# Metrics named so go down as the model gets better (unless the run's target says).
LOWER_BETTER = ("loss", "perplexity", "bits", "error")


@dataclass(frozen=True)
class Goal:
    """The metric held, and whether higher is better (then a fraction, like accuracy)."""

    metric: str
    higher: bool


def locate(run: str, store: str | None, script: str | None
           ) -> tuple[Path, Path, tuple[Path, str] | None]:
    """(the run's directory, its training script, (its run store, its id) when the
    store holds it)."""
    from tandem.monitor.runs_cli import run_folder
    from tandem.monitor.store import RunStore, store_location

    given = Path(run).expanduser()
    record: dict[str, Any] | None = None
    if (given / "checkpoints").is_dir():
        run_dir, path = given, Path(store) if store else given.parent / "tandem.db"
        if path.is_file():
            with RunStore(path) as opened:
                try:
                    record = opened.run(given.name)
                except ValueError:
                    record = None
    else:
        path = store_location(store)
        if not path.is_file():
            raise ValueError(f"tandem compress: {run!r} is not a run directory (one with "
                             f"checkpoints/) and there is no run store at {path}")
        with RunStore(path) as opened:
            record = opened.run(run)
        folder = run_folder(record)
        if folder is None or not (folder / "checkpoints").is_dir():
            raise ValueError(f"tandem compress: run {run!r} has no checkpoints at {folder}; "
                             "train it with checkpoint.at_end true")
        run_dir = folder
    chosen = script or ((record or {}).get("env") or {}).get("script")
    if not chosen or not Path(chosen).is_file():
        raise ValueError(f"tandem compress: the run's training script {chosen!r} is not on "
                         "this machine; give --script PATH")
    return run_dir, Path(chosen), (path, record["run_id"]) if record else None


def task_of(script: Path, name: str | None) -> Task:
    """The Task the script defines at module level (imported, its main part not run)."""
    return module_task(script, name, "tandem compress")


def goal_of(task: Task, given: str | None, target: str) -> Goal:
    """The metric to hold: the one given, else the one the run's `train.target` names,
    else accuracy, the task's first metric or the loss; which way is better: as the target
    says, else down for a loss, perplexity, bits or error, up for the others."""
    names = [*task.metrics, LOSS]
    if given is not None and given not in names:
        raise ValueError(f"--metric {given!r}: the task's evaluation gives {names}")
    aimed = parse_target(target) if target else None
    metric = given or (aimed[0] if aimed and aimed[0] in names else
                       "accuracy" if "accuracy" in task.metrics else names[0])
    if aimed and aimed[0] == metric:
        return Goal(metric, aimed[1] == ">=")
    return Goal(metric, not any(word in metric for word in LOWER_BETTER))


def worse_by(goal: Goal, value: float, original: float) -> float:
    """How much worse than the original, in budget units (points, or the metric's own)."""
    if goal.higher:
        return 100 * (original - value)
    return value - original


def choose(rows: dict[str, dict[str, Any]], goal: Goal, budget: float,
           prefer: str) -> tuple[str, dict[str, str], str]:
    """(the adopted name, why each other candidate was not adopted, the verdict). `rows`
    hold each measured model's metric (a mean over seeds, with its 95% `interval` when
    there were several), bytes and latency_ms by batch size; the original is
    `ORIGINAL`."""
    base = rows[ORIGINAL]
    why: dict[str, str] = {}
    eligible = []
    for name, row in rows.items():
        if name == ORIGINAL:
            continue
        if name == FINETUNED:
            why[name] = "the control (the original fine-tuned alike): never adopted"
            continue
        # Over seeds: the worse end of the 95% interval must be within the budget.
        low, high = row.get("interval") or (row["metric"], row["metric"])
        worse = worse_by(goal, low if goal.higher else high, base["metric"])
        faster = all(row["latency_ms"][b] < base["latency_ms"][b] for b in BATCHES)
        if worse > budget + 1e-9:
            shown = f" (95% interval [{low:.4g}, {high:.4g}])" if "interval" in row else ""
            why[name] = (f"{goal.metric} {row['metric']:.4g}{shown} is {worse:.3g} worse than "
                         f"the original's {base['metric']:.4g}: over the budget of {budget:g}")
        elif row["bytes"] >= base["bytes"] and not faster:
            why[name] = "neither smaller nor faster than the original"
        else:
            eligible.append(name)
    if not eligible:
        over = any("over the budget" in w for w in why.values())
        verdict = (f"no candidate meets the budget of {budget:g}: the original is kept"
                   if over else "no candidate within the budget is smaller or faster: "
                   "the original is kept")
        return ORIGINAL, why, verdict

    def key(name: str) -> tuple[float, float, float]:
        # Equal sizes (two int8 models): the better metric first, then the faster.
        r = rows[name]
        size, speed = float(r["bytes"]), float(r["latency_ms"][BATCHES[-1]])
        worse = worse_by(goal, r["metric"], base["metric"])
        return (size, worse, speed) if prefer == "size" else (speed, size, worse)

    chosen = min(eligible, key=key)
    for name in eligible:
        if name != chosen:
            why[name] = (f"within the budget, but {'larger' if prefer == 'size' else 'slower'}"
                         f" than {chosen}")
    return chosen, why, f"{chosen} adopted: the {'smallest' if prefer == 'size' else 'fastest'}" \
        f" within the budget of {budget:g}"


def export(model: nn.Module, inputs: tuple[torch.Tensor, ...], path: Path) -> int:
    """Write `model` as a torch.export program with a dynamic batch dimension; its bytes.
    The program reloaded must compute what the model computes. A model on fbgemm's int8
    kernels is written as `quant.emulated` (torch.export cannot hold packed weights)."""
    if quant.has_kernels(model):  # fbgemm's packed weights: the same arithmetic in float ops
        model = quant.emulated(copy.deepcopy(model))
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(model.eval(), inputs,
                                  dynamic_shapes=tuple({0: batch} for _ in inputs))
    torch.export.save(program, str(path))
    with torch.no_grad():
        want, got = model(*inputs), torch.export.load(str(path)).module()(*inputs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    return path.stat().st_size


def made(original: nn.Module, inputs: tuple[torch.Tensor, ...], tunes: list[FineTune],
         measure: Callable[[nn.Module], float], console: Console
         ) -> tuple[dict[str, nn.Module], dict[str, list[float]], dict[str, str]]:
    """Every candidate made once per fine-tuning seed: ({name: its first seed's model},
    {name: its metric per seed}, {name: why it could not be made}); the original first."""
    models: dict[str, nn.Module] = {ORIGINAL: original}
    scores: dict[str, list[float]] = {ORIGINAL: [measure(original)]}
    failed: dict[str, str] = {}
    for tune in tunes:
        for name, model in candidates(original, inputs, tune):
            if isinstance(model, str):
                failed[name] = model
                continue
            models.setdefault(name, model)
            scores.setdefault(name, []).append(measure(model))
            console.print(f"{name} (seed {tune.seed}): {scores[name][-1]:.4g}",
                          highlight=False)
    for name in failed:
        models.pop(name, None)
        console.print(f"{name}: {failed[name]}", highlight=False)
    return models, scores, failed


def run(ns: argparse.Namespace, console: Console) -> int:
    """`tandem compress` with its parsed options (`command.add_arguments`)."""
    from tandem.config import load
    from tandem.finetune.init_from import InitFrom

    if (min(ns.steps, ns.repeats, ns.seeds) < 1 or ns.budget < 0 or ns.lr_scale <= 0
            or not 0 <= ns.distill <= 1):
        raise ValueError("tandem compress: need --steps, --repeats and --seeds >= 1, --budget "
                         ">= 0, --lr-scale > 0 and --distill in [0, 1] (got "
                         f"{ns.steps}, {ns.repeats}, {ns.seeds}, {ns.budget}, {ns.lr_scale}, "
                         f"{ns.distill})")
    run_dir, script, stored = locate(ns.run, ns.store, ns.script)
    task = task_of(script, ns.task)
    if task.eval_data is None:
        raise ValueError("tandem compress: the task has no eval_data to measure the metric on")
    config = load(run_dir / "config.toml")
    goal = goal_of(task, ns.metric, config.train.target)
    original = task.model()
    InitFrom(str(run_dir), field="tandem compress RUN", average=True).load(original)
    original.eval()
    dataset = task.eval_data()
    inputs = model_inputs(task, collate_of(task, dataset)(
        [dataset[i] for i in range(min(BATCHES[-1], len(dataset)))]))

    def measure(model: nn.Module) -> float:
        return evaluate(model, task, dataset, goal.metric, config.train.eval_batch)

    tunes = [FineTune(task, ns.steps, config.train.global_batch, ns.lr_scale, seed,
                      teacher=original, distill=ns.distill)
             for seed in range(ns.seed, ns.seed + ns.seeds)]
    models, scores, failed = made(original, inputs, tunes, measure, console)
    rows = {name: {"metric": statistics.fmean(scores[name]), "seeds": scores[name],
                   "params": weights(m), "bytes": state_bytes(m)}
            for name, m in models.items()}
    for row in rows.values():
        if len(row["seeds"]) > 1:
            interval = mean_interval(row["seeds"])
            row["interval"] = [interval.low, interval.high]
    for name, ms in latencies(models, inputs, ns.repeats).items():
        rows[name]["latency_ms"] = ms
    chosen, why, verdict = choose(rows, goal, ns.budget, ns.prefer)
    why.update(failed)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    file_bytes = export(models[chosen], inputs, out / "model.pt2")
    record = _record(run_dir, script, goal, ns, rows, chosen, why, verdict, file_bytes)
    (out / "compress.json").write_text(json.dumps(record, indent=2) + "\n")
    if stored:  # the trade-off in the run's report and on the dashboard's run page
        from tandem.analyze.report.compression import record as record_trials
        from tandem.monitor.store import RunStore

        with RunStore(stored[0]) as opened:
            record_trials(opened, stored[1], record)
    _print(console, rows, chosen, why, verdict, goal.metric, out)
    return 0


def _record(run_dir: Path, script: Path, goal: Goal, ns: argparse.Namespace,
            rows: dict[str, dict[str, Any]], chosen: str, why: dict[str, str],
            verdict: str, file_bytes: int) -> dict[str, Any]:
    def figures(name: str) -> dict[str, Any]:
        row = rows[name]
        return {"technique": name, goal.metric: row["metric"], "seeds": row["seeds"],
                **({"interval": row["interval"]} if "interval" in row else {}),
                "params": row["params"],
                "bytes": row["bytes"],
                "latency_ms": {f"batch_{b}": row["latency_ms"][b] for b in BATCHES}}

    return {
        "run": str(run_dir), "script": str(script), "metric": goal.metric,
        "higher_is_better": goal.higher, "budget": ns.budget,
        "budget_unit": "percentage points" if goal.higher else f"{goal.metric} units",
        "prefer": ns.prefer, "fine_tune": {"steps": ns.steps, "lr_scale": ns.lr_scale,
                                           "distill": ns.distill,
                                           "seeds": list(range(ns.seed, ns.seed + ns.seeds))},
        "cpu_threads": torch.get_num_threads(), "verdict": verdict,
        "kept_original": chosen == ORIGINAL,
        # the file holds the chosen technique's model of the first seed
        "chosen": {**figures(chosen), "file": "model.pt2", "file_bytes": file_bytes,
                   f"file_{goal.metric}": rows[chosen]["seeds"][0]},
        "original": figures(ORIGINAL),
        "candidates": [figures(n) for n in rows if n != ORIGINAL],
        "rejected": [{"technique": n, "why": w} for n, w in why.items()],
    }


def _print(console: Console, rows: dict[str, dict[str, Any]], chosen: str,
           why: dict[str, str], verdict: str, metric: str, out: Path) -> None:
    console.print(f"{'model':<14} {metric:>10} {'params':>10} {'bytes':>10} "
                  f"{'ms@1':>8} {'ms@64':>8}", highlight=False)
    for name, row in rows.items():
        mark = "  <- adopted" if name == chosen else ""
        console.print(f"{name:<14} {row['metric']:>10.4f} {row['params']:>10,} "
                      f"{row['bytes']:>10,} {row['latency_ms'][1]:>8.3f} "
                      f"{row['latency_ms'][64]:>8.3f}{mark}", highlight=False)
    for name, reason in why.items():
        console.print(f"  {name}: {reason}", highlight=False)
    console.print(f"{verdict}; written {out / 'model.pt2'} and {out / 'compress.json'}",
                  highlight=False)
