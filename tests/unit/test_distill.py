"""Knowledge distillation in one process: the soft term against its formula, a run that
distils from a tandem run and from safetensors against a plain-PyTorch loop with the
same sample order, and the teacher kept frozen, in eval mode and out of the optimizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import tandem
from tandem.compress.distill import Distill, OutputCache, from_config, soft_loss
from tandem.config import validate
from tandem.errors import UsageError
from tandem.monitor.catalogue import TIME_TEACHER
from tandem.monitor.store import RunStore
from tandem.runtime import derive_seed
from tests.dist import toy_task

T, RATIO = 2.0, 0.7


def _kd(student: torch.Tensor, teacher: torch.Tensor, t: float) -> torch.Tensor:
    """T^2 * sum_c p_c (log p_c - log q_c), mean over the rows: written out by hand."""
    p = torch.softmax(teacher.double() / t, -1)
    q = torch.softmax(student.double() / t, -1)
    per_row = (p * (p.log() - q.log())).sum(-1)
    return t * t * per_row.reshape(-1).mean()


def test_the_soft_term_is_hintons_kl_over_the_last_dimension() -> None:
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(6, 10, generator=g), torch.randn(6, 10, generator=g)
    torch.testing.assert_close(soft_loss(s, t, 3.0).double(), _kd(s, t, 3.0), rtol=1e-5, atol=1e-6)
    # a sequence: every token a position of its own
    s3, t3 = torch.randn(2, 5, 7, generator=g), torch.randn(2, 5, 7, generator=g)
    torch.testing.assert_close(soft_loss(s3, t3, 1.0).double(), _kd(s3, t3, 1.0), rtol=1e-5,
                               atol=1e-6)
    assert soft_loss(t, t, 2.0).item() == pytest.approx(0.0, abs=1e-6)


def reference(teacher_state: dict[str, torch.Tensor], steps: int, global_batch: int,
              seed: int = 7) -> nn.Module:
    """One process, plain PyTorch: the documented order, the KD loss written out."""
    torch.manual_seed(derive_seed("build", seed))
    data = toy_task.IndexedData()
    model = toy_task.make_model()
    teacher = toy_task.make_model()
    teacher.load_state_dict(teacher_state)
    opt = toy_task.make_optimizer(model.parameters())
    for ids in toy_task.global_batches(steps, global_batch, seed):
        opt.zero_grad()
        out = model(data.x[ids])
        with torch.no_grad():
            taught = teacher(data.x[ids])
        task_loss = nn.functional.mse_loss(out, data.y[ids])
        (RATIO * _kd(out, taught, T).float() + (1 - RATIO) * task_loss).backward()
        opt.step()
    return model


def _config(run_dir: Path, steps: int, **train: object) -> tandem.Config:
    cfg = toy_task.config(str(run_dir), steps, 20, checkpoint={"at_end": True})
    for key, value in train.items():
        setattr(cfg.train, key, value)
    return cfg


class Watch(tandem.Component):
    """What the optimizer holds, and the teacher's state after the run."""

    def setup(self, parts: tandem.components.RunParts) -> None:
        self.optimized = {id(p) for g in parts.optimizer.param_groups for p in g["params"]}
        self.model = parts.model


def test_a_run_distils_what_a_plain_loop_distils_and_the_teacher_stays_frozen(
        tmp_path: Path) -> None:
    # a run that keeps a weight average returns it: the teacher is that average
    teacher = tandem.fit(toy_task.task(), config=_config(tmp_path / "teacher", 8,
                                                         ema_decay=0.5)).model
    state = {k: v.detach().clone() for k, v in teacher.state_dict().items()}
    want = reference(state, 6, 20).state_dict()
    distil = Distill(toy_task.make_model, tmp_path / "teacher" / "toy", T, RATIO)
    watch = Watch()
    got = tandem.fit(toy_task.task(), config=_config(tmp_path / "a", 6),
                     components=[distil, watch]).model.state_dict()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)
    held = distil.teacher
    assert held is not None and not held.training
    assert all(not p.requires_grad for p in held.parameters())
    assert not {id(p) for p in held.parameters()} & watch.optimized
    assert not any(m is held for m in watch.model.modules())
    for name, value in held.state_dict().items():
        assert torch.equal(value, state[name]), name
    with RunStore(tmp_path / "a" / "tandem.db") as store:
        run_id = store.runs()[0]["run_id"]
        split = store.metrics(run_id, name=TIME_TEACHER)
    assert split and all(m["value"] > 0 for m in split)
    # the same teacher from safetensors, through the config, its outputs cached: 15 steps
    # of 20 see half the samples twice
    save_file(state, str(tmp_path / "teacher.safetensors"))
    cfg = _config(tmp_path / "b", 15, distill_from=str(tmp_path / "teacher.safetensors"),
                  distill_temperature=T, distill_ratio=RATIO, distill_cache_mb=1.0)
    again = tandem.fit(toy_task.task(), config=cfg).model.state_dict()
    for name, value in reference(state, 15, 20).state_dict().items():
        torch.testing.assert_close(again[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_a_teacher_of_another_output_shape_is_refused_naming_both(tmp_path: Path) -> None:
    task = toy_task.task()
    task.teacher = lambda: nn.Sequential(nn.Linear(12, 5))
    with pytest.raises(UsageError, match=r"teacher's outputs have shape \[20, 5\] and the "
                                         r"student's \[20, 3\]"):
        tandem.fit(task, config=_config(tmp_path, 2))


def test_bad_distillation_settings_are_refused(tmp_path: Path) -> None:
    cfg = tandem.Config()
    cfg.train.distill_temperature = 0.0
    with pytest.raises(ValueError, match="train.distill_temperature: 0.0 is out of range"):
        validate(cfg)
    cfg = tandem.Config()
    cfg.train.distill_ratio = 1.5
    with pytest.raises(ValueError, match=r"train.distill_ratio: 1.5 is out of range.*\[0, 1\]"):
        validate(cfg)
    cfg = tandem.Config()
    cfg.train.distill_cache_mb = -1.0
    with pytest.raises(ValueError, match="train.distill_cache_mb: -1.0 is out of range"):
        validate(cfg)
    with pytest.raises(ValueError, match="train.distill_from .*: no such file"):
        Distill(toy_task.make_model, tmp_path / "missing")
    cfg = _config(tmp_path, 2, distill_from=str(tmp_path))
    cfg.plan.pp = 2
    with pytest.raises(ValueError, match="plan.pp 2 and plan.tp 1 split"):
        from_config(cfg, toy_task.task())


class Counted(nn.Module):
    """A teacher that counts the rows it computed."""

    def __init__(self) -> None:
        super().__init__()
        self.layer, self.rows = nn.Linear(4, 3), 0

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        self.rows += x.shape[0]
        return self.layer(x) * scale


def test_cached_teacher_outputs_are_the_teachers_and_seen_rows_are_not_recomputed() -> None:
    torch.manual_seed(0)
    teacher = Counted().eval()
    x, scale = torch.randn(6, 4), torch.rand(6, 1)
    row_bytes = 3 * 4 + 4 * 4 + 4  # an output row, and its key: the inputs' bytes
    cache = OutputCache(teacher, limit_bytes=8 * row_bytes)
    with torch.no_grad():
        torch.testing.assert_close(cache(x, scale), teacher.layer(x) * scale)
        assert teacher.rows == 6 and len(cache.store) == 6
        # rows 0-2 again beside 3 unseen ones: only those are computed; the store fills up
        y, s = torch.cat([x[:3], torch.randn(3, 4)]), torch.cat([scale[:3], scale[:3]])
        torch.testing.assert_close(cache(y, s), teacher.layer(y) * s)
        assert teacher.rows == 9 and len(cache.store) == 8
        assert (cache.hits, cache.misses) == (3, 9)
        # the same row with another second input is another sample
        torch.testing.assert_close(cache(x[:1], scale[:1] + 1), teacher.layer(x[:1])
                                   * (scale[:1] + 1))
        assert teacher.rows == 10
        torch.testing.assert_close(cache(x, scale), teacher.layer(x) * scale)
        assert teacher.rows == 10
        # inputs without a common first dimension pass through
        cache(x, torch.ones(1))
        assert teacher.rows == 16
