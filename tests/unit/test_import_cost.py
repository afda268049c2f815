"""Importing tandem and running a plan imports only what the plan uses: `import tandem`
and its public names no DTensor, FSDP or DCP, and a training run never the tuner's, the
dashboard's, the scheduler's stacks, nor (before its end) the analysis. Checked on
`sys.modules` in a fresh interpreter, not by timing.

A run is compared with what PyTorch itself imports for the same work: building any torch
optimizer imports torch._dynamo, which imports DTensor, so at a run's first step DTensor
is there whoever trains; what is checked is that tandem adds nothing to it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Packages a training run must not import: DTensor (and FSDP and DCP, which import it)
# only for plans that use them; the tuner's, the dashboard's and the analysis' stacks never.
NEVER_IN_A_RUN = ("torch.distributed.tensor", "torch.distributed.fsdp",
                  "torch.distributed.checkpoint", "sympy", "optuna", "starlette", "uvicorn",
                  "jinja2", "tandem.tune", "tandem.dashboard", "tandem.sched")
ANALYSIS = ("tandem.analyze",)  # the run's end (scaling figures, report) may use it

_PROBE = """
import json, sys
found = lambda names: [n for n in names if n in sys.modules]
if RUN:
    # What PyTorch itself imports for the same work: a plain loop's first step. (Building
    # any torch optimizer imports torch._dynamo, which imports DTensor.)
    import torch
    from tests.dist import toy_task
    model = toy_task.make_model()
    optimizer = toy_task.make_optimizer(model.parameters())
    from torch.utils.data import default_collate
    data = toy_task.IndexedData()
    batch = default_collate([data[0], data[1]])
    toy_task.loss(model(batch[0]), batch).backward()
    optimizer.step()
torch_own = set(found(NAMES + ANALYSIS))
import tandem
tandem.fit, tandem.Task, tandem.Config, tandem.CrossEntropy, tandem.RunResult
after_import = found(NAMES + ANALYSIS)
at_first_step = []
if RUN:
    def loss(output, batch):
        if not at_first_step:
            at_first_step.append(found(NAMES + ANALYSIS))
        return toy_task.loss(output, batch)

    task = tandem.Task(model=toy_task.make_model, optimizer=toy_task.make_optimizer,
                       train_data=toy_task.IndexedData, loss=loss)
    cfg = toy_task.config(RUN_DIR, 4, 20, checkpoint={"at_end": False})
    tandem.fit(task, config=cfg)
added = lambda names: sorted(set(names) - torch_own)
print(json.dumps({"import": added(after_import), "first_step": added(at_first_step[0])
                  if RUN else [], "end": added(found(NAMES)), "torch_own": sorted(torch_own)}))
"""


def _probe(run_dir: Path | None) -> dict[str, list[str]]:
    """What a fresh interpreter imported after `import tandem` (and a short run in it)."""
    code = (f"NAMES = {NEVER_IN_A_RUN!r}\nANALYSIS = {ANALYSIS!r}\nRUN = {run_dir is not None}\n"
            f"RUN_DIR = {str(run_dir)!r}\n" + _PROBE)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=200, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# A fresh interpreter (and a short run): sized for a 2-core AVX2-only host.
@pytest.mark.timeout(240)
def test_import_tandem_and_its_public_names_import_no_heavy_stack() -> None:
    assert _probe(None)["import"] == []


@pytest.mark.timeout(240)
def test_a_plain_run_imports_nothing_of_the_list_beyond_what_pytorch_does(
        tmp_path: Path) -> None:
    found = _probe(tmp_path)
    # Up to the first step: nothing of the list, nor the analysis stack.
    assert found["first_step"] == []
    # To the end: the run's end may analyse (scaling figures), but nothing else.
    assert found["end"] == []
