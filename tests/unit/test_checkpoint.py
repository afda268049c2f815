"""Single-process checkpoint tests: round trip, atomic commit, corruption, retention, errors."""

from __future__ import annotations

import errno
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint import filesystem

from tandem.checkpoint import CheckpointError, capture, latest, load, read_meta, restore, save
from tandem.checkpoint import manifest as manifest_mod

SHARD = "__0_0.distcp"


def build(seed: int, hidden: int = 8) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 2))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train(model: nn.Module, optim: torch.optim.Optimizer, steps: int = 3) -> None:
    for _ in range(steps):
        model(torch.randn(5, 4)).square().mean().backward()
        optim.step()
        optim.zero_grad()


def save_trained(root: Path, step: int, keep: int = 0, seed: int = 0) -> Path:
    model, optim = build(seed)
    train(model, optim)
    return save(root, step, capture(model, optim), {"step": step, "seed": seed}, keep=keep)


def weights_of(path: Path) -> dict[str, torch.Tensor]:
    model, optim = build(seed=99)
    state = capture(model, optim)
    load(path, state)
    restore(model, optim, state)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.timeout(60)
def test_round_trip_restores_weights_and_adam_state(tmp_path: Path) -> None:
    model, optim = build(seed=0)
    train(model, optim)
    meta = {"step": 7, "sampler": {"epoch": 1, "offset": 40}, "config": {"lr": 0.01}}
    path = save(tmp_path, 7, capture(model, optim), meta, keep=1)
    assert path == tmp_path / "step_000000007"
    assert latest(tmp_path) == path

    fresh, fresh_optim = build(seed=1)
    state = capture(fresh, fresh_optim)
    assert load(path, state) == meta
    restore(fresh, fresh_optim, state)

    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    want, got = optim.state_dict(), fresh_optim.state_dict()
    assert got["param_groups"][0]["lr"] == want["param_groups"][0]["lr"]
    for index, slots in want["state"].items():
        for slot, value in slots.items():
            assert torch.equal(value, got["state"][index][slot]), (index, slot)
    assert read_meta(path) == meta


@pytest.mark.timeout(60)
def test_manifest_records_files_and_global_shapes(tmp_path: Path) -> None:
    path = save_trained(tmp_path, 3)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format"] == 1 and manifest["step"] == 3
    assert set(manifest["files"]) == {".metadata", SHARD}
    assert manifest["files"][SHARD]["bytes"] == (path / SHARD).stat().st_size
    assert manifest["files"][SHARD]["sha256"] == manifest_mod.sha256_file(path / SHARD)
    assert manifest["shapes"]["model.0.weight"] == [8, 4]
    assert manifest["shapes"]["optim.state.2.bias.exp_avg"] == [2]
    assert manifest["shapes"]["optim.state.2.bias.step"] == []
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.timeout(60)
def test_latest_ignores_temp_dirs_and_dirs_without_manifest(tmp_path: Path) -> None:
    good = save_trained(tmp_path, 10)
    # An interrupted save: a temp dir (even a complete-looking one) and a step dir
    # whose manifest was never written. Neither is committed.
    shutil.copytree(good, tmp_path / ".tmp-step_000000030-abc")
    shutil.copytree(good, tmp_path / "step_000000020")
    (tmp_path / "step_000000020" / "manifest.json").unlink()
    assert latest(tmp_path) == good


@pytest.mark.timeout(60)
def test_latest_of_missing_or_empty_root_is_none(tmp_path: Path) -> None:
    assert latest(tmp_path / "nothing") is None
    assert latest(tmp_path) is None


def _truncate(path: Path) -> None:
    data = (path / SHARD).read_bytes()
    (path / SHARD).write_bytes(data[: len(data) // 2])


def _flip_byte(path: Path) -> None:
    data = bytearray((path / SHARD).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / SHARD).write_bytes(bytes(data))


def _drop_manifest(path: Path) -> None:
    (path / "manifest.json").unlink()


def _drop_metadata(path: Path) -> None:
    (path / ".metadata").unlink()


def _garble_manifest(path: Path) -> None:
    (path / "manifest.json").write_text('{"format": 1, "step": ')


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("corrupt", "problem"),
    [
        (_truncate, "size mismatch"),
        (_flip_byte, "checksum mismatch"),
        (_drop_manifest, "missing manifest"),
        (_drop_metadata, "missing file .metadata"),
        (_garble_manifest, "unreadable JSON"),
    ],
)
def test_corruption_is_detected_and_latest_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, corrupt, problem: str
) -> None:
    older = save_trained(tmp_path, 10, seed=1)
    newer = save_trained(tmp_path, 20, seed=2)
    corrupt(newer)
    with caplog.at_level(logging.WARNING, logger="tandem.checkpoint"):
        assert latest(tmp_path) == older
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(newer) in msg and problem in msg for msg in warnings), warnings
    expected, _ = build(seed=1)
    train(expected, torch.optim.Adam(expected.parameters(), lr=1e-2))
    for name, value in weights_of(older).items():
        assert torch.equal(value, expected.state_dict()[name]), name


@pytest.mark.timeout(60)
def test_load_refuses_a_checkpoint_with_a_missing_file(tmp_path: Path) -> None:
    path = save_trained(tmp_path, 1)
    (path / SHARD).unlink()
    with pytest.raises(CheckpointError, match="missing file __0_0.distcp"):
        weights_of(path)


@pytest.mark.timeout(60)
def test_retention_keeps_newest_and_sweeps_temp_dirs(tmp_path: Path) -> None:
    (tmp_path / ".tmp-step_000000001-dead").mkdir(parents=True)
    for step in (1, 2, 3, 4):
        save_trained(tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000000003", "step_000000004"]
    # Saving an older step never deletes the one just written, nor anything newer.
    save_trained(tmp_path, 2, keep=1)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["step_000000002", "step_000000003", "step_000000004"]


@pytest.mark.timeout(60)
def test_retention_does_not_count_corrupt_checkpoints(tmp_path: Path) -> None:
    good = save_trained(tmp_path, 1)
    broken = save_trained(tmp_path, 2)
    _truncate(broken)
    save_trained(tmp_path, 3, keep=2)
    assert good.is_dir(), "the last good checkpoint before the new one must survive"


@pytest.mark.timeout(60)
def test_keep_zero_keeps_everything(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save_trained(tmp_path, step, keep=0)
    assert len(list(tmp_path.glob("step_*"))) == 3


@pytest.mark.timeout(60)
def test_resaving_a_step_replaces_it(tmp_path: Path) -> None:
    save_trained(tmp_path, 5, seed=1)
    path = save_trained(tmp_path, 5, seed=2)
    assert latest(tmp_path) == path and read_meta(path)["seed"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000000005"]
    expected, _ = build(seed=2)
    train(expected, torch.optim.Adam(expected.parameters(), lr=1e-2))
    assert torch.equal(weights_of(path)["0.weight"], expected.state_dict()["0.weight"])


@pytest.mark.timeout(60)
def test_shape_mismatch_names_the_keys(tmp_path: Path) -> None:
    path = save_trained(tmp_path, 1)
    model, optim = build(seed=0, hidden=16)
    with pytest.raises(ValueError, match=r"shape mismatch: .*model\.0\.weight"):
        load(path, capture(model, optim))
    other = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2), nn.Linear(2, 2))
    state = capture(other, torch.optim.Adam(other.parameters()))
    with pytest.raises(ValueError, match=r"missing keys: .*model\.3\.weight"):
        load(path, state)
    small = nn.Sequential(nn.Linear(4, 8))
    state = capture(small, torch.optim.Adam(small.parameters()))
    with pytest.raises(ValueError, match=r"unexpected keys: .*model\.2\.weight"):
        load(path, state)


@pytest.mark.timeout(60)
def test_model_section_alone_loads_from_a_training_checkpoint(tmp_path: Path) -> None:
    path = save_trained(tmp_path, 1, seed=3)
    model, _ = build(seed=4)
    state = {"model": model.state_dict()}
    load(path, state)
    expected, _ = build(seed=3)
    train(expected, torch.optim.Adam(expected.parameters(), lr=1e-2))
    assert torch.equal(model.state_dict()["2.bias"], expected.state_dict()["2.bias"])


@pytest.mark.timeout(60)
def test_unwritable_root_raises_and_keeps_old_checkpoint(tmp_path: Path) -> None:
    good_root = tmp_path / "ckpt"
    good = save_trained(good_root, 1)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    bad_root = blocker / "ckpt"
    model, optim = build(seed=0)
    with pytest.raises(CheckpointError, match=str(bad_root)):
        save(bad_root, 2, capture(model, optim), {}, keep=1)
    assert latest(good_root) == good


@pytest.mark.timeout(60)
def test_disk_full_during_write_keeps_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = save_trained(tmp_path, 1, keep=1)

    def full_disk(transforms, stream, *args, **kwargs):
        stream.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(filesystem, "_write_item", full_disk)
    with pytest.raises(CheckpointError, match="No space left on device"):
        save_trained(tmp_path, 2, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.name]
    assert latest(tmp_path) == good


@pytest.mark.timeout(60)
def test_failed_commit_keeps_previous_and_the_replaced_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = save_trained(tmp_path, 1, seed=1)

    def broken_write(directory: Path, manifest: dict) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(manifest_mod, "write", broken_write)
    with pytest.raises(CheckpointError, match="Input/output error"):
        save_trained(tmp_path, 1, seed=2)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.name]
    assert latest(tmp_path) == good and read_meta(good)["seed"] == 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("step", "meta", "keep", "field"),
    [(-1, {}, 1, "step"), (1, {}, -1, "keep"), (1, {"x": object()}, 1, "meta")],
)
def test_bad_arguments_raise_value_error(
    tmp_path: Path, step: int, meta: dict, keep: int, field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        save(tmp_path, step, {"x": torch.zeros(1)}, meta, keep)
    assert not list(tmp_path.iterdir())
