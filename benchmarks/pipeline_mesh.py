"""PP2 x FSDP2 x TP2 on eight processes against one plain PyTorch process; its checkpoint
resumed at (PP1, DP4), (PP4, DP1) and on one process.

    python benchmarks/pipeline_mesh.py

Eight gloo processes, one thread each, train the char-LM tests' transformer (dim 16, four
blocks, embedding tied to the head; `tests/dist/test_pipeline_mesh.py`'s task) for 3 steps
as 2 pipeline stages x 2 FSDP2 shards x 2 tensor-parallel peers (1F1B, micro-batches of
2, global batch 8, grad clipping that engages, fp32) and checkpoint; the same eight go on
to step 6 from it. Copies of the step-3 checkpoint resume to step 6 as four DDP replicas,
as four stages, and on one process. Per run it prints the largest relative weight
difference to the plain loop's (per tensor: max |a - b| / max |b|), the resumed first
step's loss against the plain loop's (relative), and whether the samples each leg trained
are exactly its steps' in the documented order (each once). The test suite runs the
four-process part of this (PP2 x TP2 and its resumes) in `test_pipeline_mesh.py`; eight
processes on two cores do not fit its time budget.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tandem.data.sampler import epoch_order  # noqa: E402
from tests.dist.procs import run_ranks  # noqa: E402
from tests.dist.test_pipeline import GLOBAL, MICRO, SEED, STEPS, N, argv, reference  # noqa: E402
from tests.dist.test_pipeline_mesh import HALF, _fit  # noqa: E402

COMMON = ["--monitor.calibrate_at", "0", "--monitor.report", "false",
          "--checkpoint.async_save", "false"]
# The resumed legs: name, world size, plan, the ranks whose losses cover each global batch
# once (the last stage's first tensor-parallel peer).
LEGS = [("mesh", 8, ["--plan.pp", "2", "--plan.strategy", "fsdp", "--plan.tp", "2"], [4, 6]),
        ("dp4", 4, ["--plan.pp", "1"], [0, 1, 2, 3]),
        ("pp4", 4, ["--plan.pp", "4"], [3]),
        ("one", 1, ["--plan.pp", "1"], [0])]


def _eight(rank: int, world: int, out_dir: str) -> None:
    out = Path(out_dir)
    _fit(rank, out, "mesh-3", argv(out_dir, "mesh", HALF, 2) + COMMON + LEGS[0][2])
    if rank == 0:  # before any rank can write a later checkpoint
        for name, *_ in LEGS[1:]:
            shutil.copytree(out / "mesh", out / name)
    _fit(rank, out, "mesh", argv(out_dir, "mesh", STEPS, 2) + COMMON + LEGS[0][2])


def _legs(rank: int, world: int, out_dir: str) -> None:
    for name, size, plan, _ in LEGS[1:]:
        if size == world:
            _fit(rank, Path(out_dir), name, argv(out_dir, name, STEPS, 2) + COMMON + plan)


def worst(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """The largest per-tensor max |got - want| / max |want|."""
    assert sorted(got) == sorted(want)
    return max(((got[k] - v).abs().max() / v.abs().max()).item() for k, v in want.items())


def main() -> None:
    out = Path(tempfile.mkdtemp(prefix="pipeline_mesh-"))
    started = time.perf_counter()
    run_ranks(_eight, 8, str(out), timeout=1200)
    eight_s = time.perf_counter() - started
    run_ranks(_legs, 4, str(out), timeout=600)
    run_ranks(_legs, 1, str(out), timeout=300)
    order = epoch_order(SEED, 0, N).tolist()
    (want3, _), (want, losses) = reference(HALF), reference(STEPS)
    print(f"eight processes, both PP2 x FSDP2 x TP2 fits: {eight_s:.0f} s wall")
    print(f"PP2 x FSDP2 x TP2, step {HALF}: weights vs one process "
          f"{worst(torch.load(out / 'mesh-3.pt'), want3):.3e}")
    print("| resumed at | weights vs one process, step 6 | next-step loss, relative | "
          "samples of steps 4-6, each once |")
    print("| --- | --- | --- | --- |")
    for name, _, _, ranks in LEGS:
        seen = [s for r in ranks
                for s in json.loads((out / f"seen-{name}-{r}.json").read_text())]
        trained = sorted(i for ids, _ in seen for i in ids)
        nxt = set(order[HALF * GLOBAL:(HALF + 1) * GLOBAL])
        step = [v for ids, v in seen if set(ids) <= nxt]
        assert len(step) == GLOBAL // MICRO, name
        loss = abs(sum(step) / len(step) - losses[HALF]) / losses[HALF]
        label = {"mesh": "PP2 x FSDP2 x TP2 (8)", "dp4": "PP1 x DP4 (4)",
                 "pp4": "PP4 x DP1 (4)", "one": "one process"}[name]
        print(f"| {label} | {worst(torch.load(out / f'{name}.pt'), want):.3e} | {loss:.2e} | "
              f"{trained == sorted(order[HALF * GLOBAL:STEPS * GLOBAL])} |")


if __name__ == "__main__":
    main()
