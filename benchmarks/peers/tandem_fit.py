"""The peer comparison's tandem contender: the recipe as a ``tandem.Task`` and ``tandem.fit``.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benchmarks/peers/tandem_fit.py --task mnist1d --out /tmp/peers/tandem

tandem's default plan (DDP for 2 processes, the recipe's precision, no data workers) and its default
telemetry (phase timing, calibration at step 10, liveness records, the SQLite run store,
a checkpoint at the end); only the recipe's settings are given, plus a fresh run
directory and no progress output. tandem shuffles with its own global sampler (one
permutation per epoch from ``run.seed``), so its batches are not the other contenders'
batches, and it seeds the model from ``run.seed`` its own way. The evaluation values
with their steps come from the run store after the run.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import tandem

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipe as rc  # noqa: E402


def task_of(r: rc.Recipe, log: rc.FetchLog) -> tandem.Task:
    """The recipe's pieces as a tandem Task, with the shared clock in its datasets."""
    probe = r.eval_set()[0][1]
    metrics = {"accuracy": rc.accuracy} if probe.dim() == 0 else {}
    return tandem.Task(
        model=r.model,
        optimizer=r.optimizer,
        train_data=lambda: rc.Clocked(r.train_set(), log, "train"),
        eval_data=lambda: rc.Clocked(r.eval_set(), log, "eval"),
        loss=rc.loss,
        metrics=metrics,
        tokens_per_sample=r.tokens_per_sample,
    )


def tandem_target(target: rc.Target) -> str:
    """A recipe target in `train.target` form (tandem calls the eval loss `eval_loss`)."""
    metric = "eval_loss" if target.metric == "loss" else target.metric
    return f"{metric}{target.op}{target.value}"


def settings(r: rc.Recipe, seed: int, run_dir: Path) -> dict[str, Any]:
    """The recipe as tandem config values; everything else stays at tandem's defaults."""
    return {
        "train.steps": r.steps,
        "train.global_batch": r.global_batch,
        "train.eval_every": r.eval_every,
        "train.eval_batch": r.eval_batch,
        "train.grad_clip": r.grad_clip,
        "train.target": tandem_target(r.targets[0]),
        "optim.schedule": r.schedule,
        "optim.warmup_steps": r.warmup,
        "optim.min_lr_ratio": r.min_lr_ratio,
        "train.ema_decay": r.ema_decay,
        "precision.mode": r.precision,
        "run.seed": seed,
        "run.dir": str(run_dir),
        "run.name": "peer",
        "monitor.progress": "off",
    }


def recorded_evals(store: Path) -> list[dict[str, float]]:
    """Every evaluation of the run, by step, from the run store (rank 0)."""
    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT step, name, value FROM metrics WHERE rank = -1 AND name IN "
                          "('eval_loss', 'accuracy') ORDER BY step").fetchall()
    evals: dict[int, dict[str, float]] = {}
    for step, name, value in rows:
        evals.setdefault(step, {"step": step})["loss" if name == "eval_loss" else name] = value
    return [evals[s] for s in sorted(evals)]


def main() -> None:
    # --in-memory: the examples' data path (data.in_memory). The datasets are then read
    # once at start, so the shared fetch clock sees no training or evaluation start:
    # use tandem's own figures (tandem_summary) for such runs.
    in_memory = "--in-memory" in sys.argv
    args = rc.parse_args([a for a in sys.argv[1:] if a != "--in-memory"])
    rc.limit_threads()
    r = rc.recipe(args.task, args.steps)
    log = rc.FetchLog()
    run_dir = Path(args.out) / "run"
    defaults = {**settings(r, args.seed, run_dir), "data.in_memory": in_memory}
    result = tandem.fit(task_of(r, log), argv=[], defaults=defaults)
    rank = int(os.environ.get("RANK", "0"))
    s = result.summary
    own = {k: s.get(k) for k in ("time_to_target_s", "samples_per_s", "tokens_per_s",
                                 "wall_time_s", "eval_time_s", "target", "steps",
                                 "global_batch", "train_started_at")}
    evals = recorded_evals(run_dir / "tandem.db") if rank == 0 else []
    rc.write_result(args.out, rank, log, evals, steps=s["steps"], tandem_summary=own)


if __name__ == "__main__":
    main()
