"""Fine-tuning against training from scratch: time to the shifted task's target.

Trains the demo (`examples/mnist1d_cnn.py`) once as the source, then for each seed runs
`examples/mnist1d_finetune.py` twice on 2 processes, interleaved: fine-tuned from the
demo's weights (`run.init_from`, 0.3x the learning rates) and from scratch (`--run.init_from
'' --lr-scale 1`); prints each run's time to the target (training seconds to the first
evaluation that meets it, the source's own training not counted) and the median ratio.

With `--lora-pairs N` it then fine-tunes the char-LM (`examples/char_lm.py`, trained once
as the source) N times each way, interleaved: all weights, and LoRA adapters of rank 8
on the attention's query and value projections (`train.lora_rank`, `lora_targets`, as
torchtune's LoRA recipes do), and prints the optimizer state each keeps (elements
in its checkpoint's `optim` section), the checkpoint's size, and the steady-state step
time (`time/step` windows after the first), LoRA's against the full fine-tune's.

    python benchmarks/finetune.py --seeds 5
    python benchmarks/finetune.py --seeds 0 --lora-pairs 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import (  # noqa: E402
    CHAR_LM,
    ROOT,
    child_env,
    run_checked,
    summary,
    tandem_command,
    window_values,
)

from tandem.checkpoint import manifest  # noqa: E402

DEMO = ROOT / "examples" / "mnist1d_cnn.py"
FINETUNE = ROOT / "examples" / "mnist1d_finetune.py"
LAUNCH = ["--nproc-per-node", "2"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--lora-pairs", type=int, default=0)
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    ns = parser.parse_args()
    work = Path(ns.dir or tempfile.mkdtemp(prefix="tandem-finetune-"))
    runs, env = work / "runs", child_env()
    quiet = ["--run.dir", str(runs), "--monitor.progress", "off", "--monitor.report", "false"]
    if ns.seeds:
        time_to_target(ns.seeds, runs, env, quiet)
    if ns.lora_pairs:
        lora(ns.lora_pairs, runs, env, quiet)


def time_to_target(seeds: int, runs: Path, env: dict[str, str], quiet: list[str]) -> None:
    """The fine-tuned and from-scratch arms on the shifted MNIST-1D task."""
    run_checked(tandem_command(LAUNCH, DEMO, [*quiet, "--run.name", "source"]),
                timeout=600, env=env, what="the source run")
    source = str(runs / "source")
    rows = []
    for seed in range(seeds):
        times = {}
        for arm, flags in (("fine-tuned", ["--run.init_from", source]),
                           ("from scratch", ["--run.init_from", "", "--lr-scale", "1"])):
            name = f"{arm.split()[-1]}-{seed}"
            run_checked(tandem_command(LAUNCH, FINETUNE, [*quiet, *flags, "--run.name", name,
                                                          "--run.seed", str(seed),
                                                          "--checkpoint.at_end", "false"]),
                        timeout=600, env=env, what=f"{arm} seed {seed}")
            got = summary(runs / name)
            times[arm] = got.get("time_to_target_s")
            print(f"seed {seed} {arm:>12}: time to target {times[arm]} s "
                  f"({got.get('target')})", flush=True)
        rows.append(times)
    ratios = [r["fine-tuned"] / r["from scratch"] for r in rows
              if r["fine-tuned"] and r["from scratch"]]
    def median(arm: str) -> float:
        return statistics.median(r[arm] or float("inf") for r in rows)

    print(f"\nmedian fine-tuned {median('fine-tuned'):.3g} s, "
          f"from scratch {median('from scratch'):.3g} s; ratio per seed "
          f"{[round(x, 3) for x in ratios]}, median "
          f"{statistics.median(ratios) if ratios else float('nan'):.3g} "
          f"({len(ratios)} of {len(rows)} seeds reached the target in both arms)")


def lora(pairs: int, runs: Path, env: dict[str, str], quiet: list[str]) -> None:
    """Full fine-tune against LoRA on the char-LM: optimizer state, checkpoint, step time."""
    run_checked(tandem_command(LAUNCH, CHAR_LM, [*quiet, "--run.name", "lm-source"]),
                timeout=900, env=env, what="the char-LM source run")
    store = runs / "tandem.db"
    got: dict[str, list[dict[str, float]]] = {"full": [], "lora": []}
    for pair in range(pairs):
        for arm in ("full", "lora") if pair % 2 == 0 else ("lora", "full"):
            name = f"lm-{arm}-{pair}"
            flags = ["--run.init_from", str(runs / "lm-source"), "--train.steps", "60",
                     "--train.target", "", "--monitor.log_every", "10", "--run.name", name,
                     "--monitor.store", str(store)]
            if arm == "lora":
                flags += ["--train.lora_rank", "8", "--train.lora_targets", "*.q,*.v"]
            run_checked(tandem_command(LAUNCH, CHAR_LM, [*quiet, *flags]), timeout=900,
                        env=env, what=f"char-LM {arm} fine-tune {pair}")
            ckpt = next((runs / name / "checkpoints").glob("step_*"))
            shapes = manifest.read(ckpt)["shapes"]
            optim = sum(_numel(v) for k, v in shapes.items() if k.startswith("optim."))
            size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
            steps = window_values(store, name, "time/step")[1:]
            got[arm].append({"optim": optim, "bytes": size,
                             "step_s": statistics.median(steps)})
            print(f"{name}: optimizer state {optim:,} elements, checkpoint {size:,} bytes, "
                  f"step {1000 * got[arm][-1]['step_s']:.1f} ms", flush=True)
    full, lo = got["full"], got["lora"]
    step = [a["step_s"] / b["step_s"] for a, b in zip(lo, full, strict=True)]
    print(f"\nLoRA / full: optimizer state {lo[0]['optim'] / full[0]['optim']:.2%}, "
          f"checkpoint {lo[0]['bytes'] / full[0]['bytes']:.2%}, step time per pair "
          f"{[round(x, 3) for x in step]}, median {statistics.median(step):.3f}")


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


if __name__ == "__main__":
    main()
