"""Time-to-accuracy of tandem against what users would write instead, side by side.

    python benchmarks/peers/run.py                      # both tasks, 3 repeats each
    python benchmarks/peers/run.py --task mnist1d --repeats 5
    python benchmarks/peers/run.py --repeats 1 --steps 200   # a quick smoke run

Contenders, each the same recipe (``recipe.py``) on 2 CPU processes (gloo, one thread
each), all launched the same way (``python -m torch.distributed.run --standalone
--nproc-per-node 2``): a hand-written DDP loop, HuggingFace Accelerate, PyTorch Lightning
and tandem. For MNIST-1D the paper's own CNN and recipe runs in the hand-written loop as
a reference row. Every run is a fresh set of processes; the contenders are interleaved
and their order rotates from repeat to repeat; repeat r uses seed r for every contender
(``--seed`` fixes one seed for all repeats instead).

Prints the tables, writes ``results.json`` (raw per-rank results and the figures) and an
SVG of the evaluation curves against wall time per task into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import figures as fg  # noqa: E402
import plot  # noqa: E402
from recipe import recipe  # noqa: E402

SCRIPTS = {
    "ddp": "ddp_loop.py",
    "accelerate": "accelerate_loop.py",
    "lightning": "lightning_fit.py",
    "tandem": "tandem_fit.py",
}
LABELS = {
    "ddp": "hand-written DDP",
    "accelerate": "Accelerate",
    "lightning": "Lightning",
    "tandem": "tandem",
    "paper_cnn": "paper CNN (hand-written DDP)",
}
PAPER = (("logistic regression", "32%"), ("MLP", "68%"), ("CNN", "94%"), ("GRU", "91%"),
         ("human", "96%"))


def entries(task: str, contenders: list[str], paper: bool) -> list[tuple[str, str, str]]:
    """(name, script, recipe task) of every run in one repeat of `task`."""
    out = [(c, SCRIPTS[c], task) for c in contenders]
    if task == "mnist1d" and paper:
        out.append(("paper_cnn", SCRIPTS["ddp"], "mnist1d_paper"))
    return out


def launch(script: str, task: str, seed: int, steps: int | None, out: Path,
           timeout: float) -> dict[str, Any]:
    """Run one contender under torchrun; return its clock, exit status and rank files."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(HERE / script), "--task", task, "--seed", str(seed), "--out", str(out)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with open(out / "output.log", "w") as log:
        launched = time.time()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its workers
            proc.wait()
            code = None
        exited = time.time()
    ranks = []
    for rank in (0, 1):
        path = out / f"rank{rank}.json"
        if path.exists():
            ranks.append(json.loads(path.read_text()))
    return {"cmd": cmd, "launch_epoch": launched, "exit_epoch": exited, "returncode": code,
            "timed_out": code is None, "ranks": ranks}


def tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(text[-lines:])


def run_task(task: str, args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Every repeat of every contender of `task`, interleaved, the order rotating."""
    runs = []
    plan = entries(task, args.contenders, not args.no_paper)
    for repeat in range(args.repeats):
        seed = args.seed if args.seed is not None else repeat
        shift = repeat % len(plan)
        for name, script, recipe_task in plan[shift:] + plan[:shift]:
            where = out / task / f"repeat{repeat}" / name
            print(f"[{task} repeat {repeat} seed {seed}] {LABELS[name]} ...", end=" ", flush=True)
            run = launch(script, recipe_task, seed, args.steps, where, args.timeout)
            run.update(task=task, recipe=recipe_task, contender=name, repeat=repeat, seed=seed)
            if run["returncode"] == 0 and fg.ranks_ok(run["ranks"]):
                run["figures"] = fg.run_figures(recipe(recipe_task, args.steps), run["ranks"],
                                                run["launch_epoch"], run["exit_epoch"])
                print(f"{run['exit_epoch'] - run['launch_epoch']:.1f} s")
            else:
                why = "timed out" if run["timed_out"] else f"exit {run['returncode']}"
                run["error"] = f"{why}\n{tail(where / 'output.log')}"
                print(f"FAILED ({why}); see {where / 'output.log'}")
            runs.append(run)
    return runs


def print_task(task: str, runs: list[dict[str, Any]], steps: int | None) -> dict[str, Any]:
    """The tables of one task; returns the per-contender summaries."""
    names = list(dict.fromkeys(run["contender"] for run in runs))
    summaries = {}
    for name in names:
        mine = [run for run in runs if run["contender"] == name]
        summaries[name] = fg.summarize(recipe(mine[0]["recipe"], steps), mine)
    r = recipe(task, steps)
    base = summaries.get("tandem")
    labels = [t.label() for t in r.targets]
    print(f"\n## {task}: {r.steps} steps, global batch {r.global_batch}, evaluation every "
          f"{r.eval_every} steps; 2 processes; median [min-max] over repeats\n")
    head = ["contender"] + [f"time to {lb} (s)" for lb in labels] + \
        [f"steps to {lb}" for lb in labels] + [f"time / tandem's ({lb})" for lb in labels]
    print("| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    for name, s in summaries.items():
        cells = [LABELS[name]]
        cells += [fg.fmt_spread(s[f"ttt {lb}"]) for lb in labels]
        cells += [fg.fmt_spread(s[f"steps {lb}"], 0) for lb in labels]
        cells += [fg.ratio(s[f"ttt {lb}"], base and base[f"ttt {lb}"]) for lb in labels]
        print("| " + " | ".join(cells) + " |")
    unit, key = ("tokens/s", "tokens_per_s") if r.tokens_per_sample else ("samples/s",
                                                                         "samples_per_s")
    final = "final loss" if r.tokens_per_sample else "final accuracy"
    head = ["contender", f"training {unit}", "/ tandem's", "ms/step", "peak RSS/rank (MiB)",
            final, "start-up (s)", "of it launcher (s)", "whole run (s)"]
    print("\n| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    for name, s in summaries.items():
        value = fg.fmt_spread(s["final loss"], 3) if r.tokens_per_sample else \
            fg.fmt_spread(s["final accuracy"], 1, 100, "%")
        cells = [LABELS[name], fg.fmt_spread(s[key], 0), fg.ratio(s[key], base and base[key]),
                 fg.fmt_spread(s["ms_per_step"]), fg.fmt_spread(s["peak_rss_mib"], 0), value,
                 fg.fmt_spread(s["startup_s"]), fg.fmt_spread(s["launcher_s"]),
                 fg.fmt_spread(s["total_s"])]
        print("| " + " | ".join(cells) + " |")
    cross_check(runs, labels[0])
    return summaries


def cross_check(runs: list[dict[str, Any]], first: str) -> None:
    """tandem's own figures next to the shared clock's, run by run."""
    pairs = []
    for run in runs:
        fig = run.get("figures") or {}
        own = fig.get("tandem_summary")
        if not own:
            continue
        hit = fig["targets"][first]
        clock = f"{hit['s']:.2f} s" if hit else "not reached"
        mine = own.get("time_to_target_s")
        pairs.append(f"repeat {run['repeat']}: time to {first} {clock} (shared clock) vs "
                     f"{'not reached' if mine is None else f'{mine:.2f} s'} (tandem's "
                     f"summary); {fig['samples_per_s']:,.1f} vs {own['samples_per_s']:,.1f} "
                     "samples/s")
    if pairs:
        print("\ncross-check, " + "\n             ".join(pairs))


def print_paper(summaries: dict[str, Any]) -> None:
    """The MNIST-1D paper's accuracies next to the measured rows."""
    print("\n## MNIST-1D: the paper's test accuracies (Greydanus 2020) and the measured rows\n")
    print("| model | test accuracy | time to 94% (s) | time to 99% (s) |\n"
          "| --- | --- | --- | --- |")
    for model, acc in PAPER:
        print(f"| {model} (paper) | {acc} | - | - |")
    for name, label in (("paper_cnn", "paper CNN and recipe, measured here (final; best)"),
                        ("tandem", "this recipe with tandem, measured here (final)")):
        s = summaries.get(name)
        if s is None:
            continue
        acc = fg.fmt_spread(s["final accuracy"], 1, 100, "%")
        if name == "paper_cnn":
            acc += "; " + fg.fmt_spread(s["best_accuracy"], 1, 100, "%")
        print(f"| {label} | {acc} | {fg.fmt_spread(s['ttt 94%'])} | "
              f"{fg.fmt_spread(s['ttt 99%'])} |")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": platform.platform(),
           "cpus": str(os.cpu_count())}
    for dist in ("torch", "accelerate", "lightning", "tandem"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("mnist1d", "char_lm", "all"), default="all")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None,
                        help="override every recipe's steps (smoke runs)")
    parser.add_argument("--seed", type=int, default=None,
                        help="one seed for every repeat (default: repeat r uses seed r)")
    parser.add_argument("--contenders", nargs="+", choices=list(SCRIPTS), default=list(SCRIPTS))
    parser.add_argument("--no-paper", action="store_true", help="skip the paper CNN row")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per run")
    parser.add_argument("--out", default=str(ROOT / "runs" / "peers"))
    parser.add_argument("--from-json", metavar="FILE",
                        help="print the tables of an earlier results.json instead of running")
    args = parser.parse_args()
    if args.from_json:
        reprint(Path(args.from_json))
        return
    tasks = ["mnist1d", "char_lm"] if args.task == "all" else [args.task]
    for task in tasks:
        r = recipe(task, args.steps)
        if r.steps % r.eval_every:
            parser.error(f"--steps must be a multiple of {r.eval_every} (the eval cadence)")
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    info = versions()
    print("versions: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    print(f"results: {out}")
    report: dict[str, Any] = {"versions": info, "args": vars(args), "tasks": {}}
    for task in tasks:
        runs = run_task(task, args, out)
        summaries = print_task(task, runs, args.steps)
        if task == "mnist1d":
            print_paper(summaries)
        report["tasks"][task] = {"runs": runs, "summaries": summaries}
        svg = plot.curves(task, runs, recipe(task, args.steps), LABELS)
        (out / f"{task}.svg").write_text(svg)
        print(f"\ncurves: {out / f'{task}.svg'}")
    (out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"raw results: {out / 'results.json'}")
    print_notes()


def reprint(path: Path) -> None:
    """The tables of a results.json, recomputed from its raw per-rank results."""
    report = json.loads(path.read_text())
    steps = report["args"]["steps"]
    print("versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
    for task, data in report["tasks"].items():
        for run in data["runs"]:
            if fg.ranks_ok(run["ranks"]) and run["returncode"] == 0:
                run["figures"] = fg.run_figures(recipe(run["recipe"], steps), run["ranks"],
                                                run["launch_epoch"], run["exit_epoch"])
        summaries = print_task(task, data["runs"], steps)
        if task == "mnist1d":
            print_paper(summaries)
    print_notes()


def print_notes() -> None:
    print("""
Clock (the same for every contender, in the datasets, see recipe.py): training starts at the
first training sample fetched (after process-group set-up and model build); time-to-target
runs to the start of the first evaluation meeting the target, earlier evaluations included
('train-only' figures in results.json leave them out). Training throughput: steps x global
batch over the training time less the evaluation pauses. Start-up: launch to the start of
training (the launcher, interpreter, imports, process group, data and model); 'of it
launcher': launch to the worker process's creation. Peak RSS: ru_maxrss of each worker,
the largest over the ranks (torchrun's own process not counted).""")


if __name__ == "__main__":
    main()
