"""Training throughput of tandem against a hand-written DDP loop of the same recipe.

    python benchmarks/speedrun_throughput.py --task mnist1d --repeats 5
    python benchmarks/speedrun_throughput.py --task mnist1d_muon --repeats 5 --steps 1000
    python benchmarks/speedrun_throughput.py --task char_lm --repeats 3 --steps 150
    python benchmarks/speedrun_throughput.py --task char_lm_muon --repeats 5 --steps 150

Contenders (2 CPU processes each, `python -m torch.distributed.run --standalone`, the
recipe of `benchmarks/peers/recipe.py`, interleaved, the order rotating each repeat,
repeat r = seed r):

* hand-written DDP: `benchmarks/peers/ddp_loop.py` (DataLoader, DistributedSampler);
* tandem: `benchmarks/peers/tandem_fit.py` at its default plan with all its telemetry
  on (phase timing, calibration, liveness, the run store, a checkpoint at the end);
* tandem, in memory: the same with `data.in_memory`, the examples' data path.

Training throughput is steps x global batch over the training wall time less the
evaluations: for the DDP loop from the shared fetch clock of `recipe.py`, for tandem
from its own clock (`wall_time_s - eval_time_s`: from the first step to the end of the
run, the last checkpoint's wait included, evaluations left out). For tandem's DataLoader
runs both clocks are printed, as a cross-check. Ratios are taken pair by pair within a
repeat (the same seed, minutes apart) and summarised by their median and range.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
sys.path.insert(0, str(PEERS))

import figures as fg  # noqa: E402
from recipe import recipe  # noqa: E402

CONTENDERS = {
    "ddp": ("ddp_loop.py", []),
    "tandem": ("tandem_fit.py", []),
    "tandem_mem": ("tandem_fit.py", ["--in-memory"]),
}
LABELS = {"ddp": "hand-written DDP", "tandem": "tandem (DataLoader)",
          "tandem_mem": "tandem (in memory)"}


def launch(name: str, task: str, seed: int, steps: int | None, out: Path,
           timeout: float) -> dict[str, Any]:
    """One run of a contender; its rank files, launch and exit times."""
    script, extra = CONTENDERS[name]
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(PEERS / script), "--task", task, "--seed", str(seed), "--out", str(out),
           *extra, *(["--steps", str(steps)] if steps else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    load = os.getloadavg()[0]
    launched = time.time()
    with open(out / "output.log", "w") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                              timeout=timeout, cwd=HERE.parent).returncode
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)
             if (out / f"rank{r}.json").exists()]
    return {"code": code, "launch": launched, "exit": time.time(), "ranks": ranks,
            "load": round(load, 2)}


def throughput(name: str, run: dict[str, Any], task: str, steps: int | None) -> dict[str, Any]:
    """Samples/s on the contender's clock (and the fetch clock too for tandem's DataLoader)."""
    r = recipe(task, steps)
    out: dict[str, Any] = {"load": run["load"]}
    if name != "tandem_mem":
        out["fetch_clock"] = fg.run_figures(r, run["ranks"], run["launch"],
                                            run["exit"])["samples_per_s"]
    if name == "ddp":
        out["samples_per_s"] = out["fetch_clock"]
        return out
    own = run["ranks"][0]["tandem_summary"]
    train_s = own["wall_time_s"] - own["eval_time_s"]
    out["samples_per_s"] = own["steps"] * own["global_batch"] / train_s
    out["tandem_reported"] = own["samples_per_s"]  # window busy time only
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True,
                        choices=("mnist1d", "mnist1d_muon", "char_lm", "char_lm_muon"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", default="")
    ns = parser.parse_args()
    out = Path(ns.out or tempfile.mkdtemp(prefix=f"throughput-{ns.task}-"))
    names = list(CONTENDERS)
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for repeat in range(ns.repeats):
        for name in names[repeat % 3:] + names[:repeat % 3]:
            run = launch(name, ns.task, repeat, ns.steps, out / f"r{repeat}" / name,
                         ns.timeout)
            if run["code"] != 0 or not run["ranks"]:
                print(f"repeat {repeat} {name}: FAILED (exit {run['code']}), see {out}")
                rows[name].append({})
                continue
            fig = throughput(name, run, ns.task, ns.steps)
            rows[name].append(fig)
            print(f"repeat {repeat} {name}: {fig['samples_per_s']:,.0f} samples/s "
                  f"(load {fig['load']})", flush=True)
    print(f"\n{ns.task}: training samples/s, 2 processes, {ns.repeats} interleaved repeats\n")
    print("| contender | samples/s median [min-max] | / hand-written DDP, pair by pair "
          "| load |\n| --- | --- | --- | --- |")
    for name in names:
        values = [r["samples_per_s"] for r in rows[name] if r]
        ratios = [a["samples_per_s"] / b["samples_per_s"]
                  for a, b in zip(rows[name], rows["ddp"], strict=True) if a and b]
        loads = [r["load"] for r in rows[name] if r]
        print(f"| {LABELS[name]} | {_spread(values, 0)} | {_spread(ratios, 3)} | "
              f"{_spread(loads, 1)} |")
    pairs = [(r["samples_per_s"], r["fetch_clock"]) for r in rows["tandem"] if r]
    print("\ncross-check, tandem (DataLoader): own clock vs fetch clock: "
          + ", ".join(f"{a:,.0f} vs {b:,.0f}" for a, b in pairs))
    (out / "throughput.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"raw: {out / 'throughput.json'}")
    return 0


def _spread(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:,.{digits}f} [{min(values):,.{digits}f}-{max(values):,.{digits}f}]"


if __name__ == "__main__":
    raise SystemExit(main())
