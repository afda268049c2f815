"""Distillation at two ranks under DDP and FSDP2: the teacher stays a plain, whole module
beside the wrapped or sharded student, and the student trains to the weights of the
one-process reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

import tandem
from tandem.compress.distill import Distill
from tests.dist import toy_task
from tests.dist.procs import run_ranks
from tests.unit.test_distill import RATIO, T, reference


class Wrapped(tandem.Component):
    """Whether the student is DDP-wrapped and the teacher is not (and not inside it)."""

    def __init__(self, distil: Distill, out: str) -> None:
        self.distil, self.out = distil, out

    def setup(self, parts: tandem.components.RunParts) -> None:
        self.model = parts.model

    def close(self) -> None:
        teacher = self.distil.teacher
        found = {"student_wrapped": isinstance(self.model, (DistributedDataParallel,
                                                            FSDPModule)),
                 "teacher_wrapped": isinstance(teacher, (DistributedDataParallel, FSDPModule)),
                 "teacher_sharded": any(isinstance(p, DTensor) for p in teacher.parameters()),
                 "teacher_inside": any(m is teacher for m in self.model.modules()),
                 "teacher_training": bool(teacher is not None and teacher.training)}
        torch.save(found, Path(self.out, f"wrapped_{torch.distributed.get_rank()}.pt"))


def _leg(rank: int, world: int, out: str, source: str, strategy: str) -> None:
    distil = Distill(toy_task.make_model, source, T, RATIO)
    cfg = toy_task.config(out, 6, 20, plan={"strategy": strategy})
    result = tandem.fit(toy_task.task(), config=cfg, components=[distil, Wrapped(distil, out)])
    if rank == 0:
        torch.save(result.model.state_dict(), Path(out, "final.pt"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_distil_what_one_process_distils_with_a_whole_plain_teacher(
        tmp_path: Path, strategy: str) -> None:
    src = tmp_path / "teacher"
    cfg = toy_task.config(str(src), 8, 20, checkpoint={"at_end": True})
    teacher = tandem.fit(toy_task.task(), config=cfg).model.state_dict()
    want = reference(teacher, 6, 20).state_dict()
    out = tmp_path / "two"
    out.mkdir()
    run_ranks(_leg, 2, str(out), str(src / "toy"), strategy, timeout=240)
    for rank in (0, 1):
        found = torch.load(out / f"wrapped_{rank}.pt", weights_only=True)
        assert found == {"student_wrapped": True, "teacher_wrapped": False,
                         "teacher_sharded": False, "teacher_inside": False,
                         "teacher_training": False}, rank
    got = torch.load(out / "final.pt", weights_only=True)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)
