"""Loading a checkpoint runs no code from it, and a signed manifest cannot be changed."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from tandem.checkpoint import (
    CheckpointError,
    CheckpointManager,
    ModelWeights,
    OptimizerState,
    capture,
    latest,
    load,
    manifest,
    save,
)
from tandem.checkpoint.safe_read import read_metadata


def _trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).sum().backward()
    optim.step()
    return model, optim


class Payload:
    """What an attacker would put in a pickle: a call made while unpickling."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, ("touch /tmp/tandem-pwned",))


def test_crafted_metadata_is_refused_even_with_matching_hashes(tmp_path: Path) -> None:
    model, optim = _trained()
    path = save(tmp_path, 1, capture(model, optim), {"step": 1}, keep=0)
    (path / ".metadata").write_bytes(pickle.dumps(Payload()))
    # Re-hash as an attacker with write access (and no signing key) would.
    doc = json.loads((path / "manifest.json").read_text())
    doc["files"][".metadata"] = {"bytes": (path / ".metadata").stat().st_size,
                                 "sha256": manifest.sha256_file(path / ".metadata")}
    (path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="posix.system|os.system"):
        load(path, capture(*_trained()))
    assert not Path("/tmp/tandem-pwned").exists()


def test_metadata_reader_builds_only_dcp_classes(tmp_path: Path) -> None:
    model, optim = _trained()
    path = save(tmp_path, 1, capture(model, optim), {"step": 1}, keep=0)
    assert "model.weight" in read_metadata(path / ".metadata").state_dict_metadata


def test_a_run_checkpoint_holds_tensors_only(tmp_path: Path) -> None:
    model, optim = _trained()
    states = {"model": ModelWeights(model), "optim": OptimizerState(model, optim)}
    manager = CheckpointManager(tmp_path, states, keep=0, asynchronous=False)
    manager.save(3, {"config": {}})
    path = latest(tmp_path)
    assert path is not None
    items = read_metadata(path / ".metadata").state_dict_metadata
    assert not [k for k, v in items.items() if isinstance(v, BytesStorageMetadata)]
    # The optimizer's settings are in the JSON manifest instead, and load back exactly.
    fresh_model, fresh_optim = nn.Linear(4, 2), torch.optim.Adam(nn.Linear(4, 2).parameters())
    fresh_optim = torch.optim.Adam(fresh_model.parameters(), lr=0.5, betas=(0.1, 0.2))
    CheckpointManager(tmp_path, {"model": ModelWeights(fresh_model),
                                 "optim": OptimizerState(fresh_model, fresh_optim)},
                      keep=0, asynchronous=False).restore(path)
    group = fresh_optim.param_groups[0]
    assert group["lr"] == 1e-2 and tuple(group["betas"]) == (0.9, 0.999)
    assert torch.equal(fresh_model.weight, model.weight)


def test_signed_manifests_refuse_changes_and_other_keys(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    model, optim = _trained()
    monkeypatch.setenv(manifest.KEY_ENV, "first key")
    path = save(tmp_path, 1, capture(model, optim), {"step": 1, "lr": 0.01}, keep=0)
    assert latest(tmp_path) == path
    doc = json.loads((path / "manifest.json").read_text())
    doc["meta"]["lr"] = 10.0  # a change that keeps the JSON valid
    (path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="signature does not match"):
        manifest.verify(path)
    assert latest(tmp_path) is None
    signed = save(tmp_path, 2, capture(model, optim), {"step": 2}, keep=0)
    monkeypatch.setenv(manifest.KEY_ENV, "another key")
    with pytest.raises(CheckpointError, match="signature does not match"):
        manifest.verify(signed)
    monkeypatch.delenv(manifest.KEY_ENV)
    unsigned = save(tmp_path, 3, capture(model, optim), {"step": 3}, keep=0)
    monkeypatch.setenv(manifest.KEY_ENV, "first key")
    with pytest.raises(CheckpointError, match="not signed"):
        manifest.verify(unsigned)
    assert latest(tmp_path) == signed.with_name("step_000000002") and manifest.verify(signed)
