"""Every plan trains the MNIST-1D example to within a tolerance of DDP's loss after K steps.

One process group of 2 ranks runs the example's task (`examples/mnist1d_cnn.py`) under
each plan for the same K steps from the same seed; the exact plans (fp16 aside) must
land where DDP lands, the lossy ones near it. Tolerances are on the evaluation loss
over the 1000 test samples.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import tandem

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

STEPS = 60
PLANS: dict[str, dict[str, str]] = {
    "ddp": {},
    "fsdp": {"plan.strategy": "fsdp"},
    "fp16": {"plan.comm_hook": "fp16"},
    "powersgd": {"plan.comm_hook": "powersgd", "plan.powersgd_rank": "4"},
    "topk": {"plan.comm_hook": "topk", "plan.topk_ratio": "0.1"},
    "localsgd": {"plan.strategy": "localsgd", "plan.sync_every": "4"},
    "diloco": {"plan.strategy": "diloco", "plan.sync_every": "4"},
    "checkpointing": {"plan.activation_checkpointing": "true"},
}
# Relative distance from DDP's evaluation loss each plan may land at after STEPS steps.
# Measured: fsdp and checkpointing equal, fp16 +0.002%, powersgd +7%, localsgd +7%,
# diloco +12%, topk (10%) +29%: the lossy plans lag early in training.
TOLERANCE = {"ddp": 0.0, "fsdp": 1e-4, "checkpointing": 1e-4, "fp16": 0.01,
             "powersgd": 0.15, "topk": 0.4, "localsgd": 0.15, "diloco": 0.2}


def _train(rank: int, world: int, out: str) -> None:
    import dataclasses

    from mnist1d_cnn import make_optimizer, task

    # The plans' tolerances were measured with the AdamW recipe (the record's Muon
    # orthogonalises what a lossy hook leaves of the gradient: another question).
    task = dataclasses.replace(task, optimizer=make_optimizer)

    losses = {}
    for name, flags in PLANS.items():
        argv = ["--run.dir", out, "--run.name", name, "--train.steps", str(STEPS),
                "--train.global_batch", "128", "--train.eval_every", "0",
                "--train.eval_batch", "500", "--optim.schedule", "warmup_cosine",
                "--optim.warmup_steps", "10", "--monitor.progress", "off",
                "--checkpoint.at_end", "false", "--monitor.calibrate_at", "0"]
        for key, value in flags.items():
            argv += [f"--{key}", value]
        losses[name] = tandem.fit(task, argv=argv).summary["eval_loss"]
    if rank == 0:
        Path(out, "losses.json").write_text(json.dumps(losses))


@pytest.mark.timeout(240)
def test_every_plan_lands_near_ddp_on_mnist1d(tmp_path: Path) -> None:
    from tests.dist.procs import run_ranks

    run_ranks(_train, 2, str(tmp_path), timeout=230)
    losses = json.loads((tmp_path / "losses.json").read_text())
    ddp = losses["ddp"]
    assert ddp < 0.6 * 2.303  # it learned: well below chance (ln 10)
    for name, loss in losses.items():
        assert abs(loss - ddp) <= TOLERANCE[name] * ddp + 1e-6, (name, loss, ddp)
        assert loss < 0.7 * 2.303, (name, loss)  # every plan learned
