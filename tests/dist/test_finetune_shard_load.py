"""`run.init_from` a safetensors file written by the `safetensors` package from a plain
PyTorch model, into a model sharded over two ranks: each rank reads only the block of
each tensor it holds (FSDP2's row shards, tensor parallelism's column/row split, whole
tensors where the plan replicates them), and the sharded model computes what the plain
model computes. The bytes each rank read are checked against the blocks torch.chunk
gives that rank, computed here from the plain model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from tests.dist.procs import run_ranks

PLAN = {"0": "colwise", "2": "rowwise"}


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 7))


def _expected_bytes(state: dict[str, torch.Tensor], rank: int, world: int, split: str) -> int:
    """The bytes of rank `rank`'s blocks: FSDP2 splits every tensor by rows; tensor
    parallelism splits layer 0 by rows (weight and bias) and layer 2's weight by columns,
    and keeps layer 2's bias whole."""
    total = 0
    for name, value in state.items():
        if split == "fsdp" or name.startswith("0."):
            block = torch.chunk(value, world, dim=0)[rank]
        elif name == "2.weight":
            block = torch.chunk(value, world, dim=1)[rank]
        else:
            block = value
        total += block.numel() * block.element_size()
    return total


def _leg(rank: int, world: int, out: str, sources: list[str]) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from tandem.finetune.init_from import InitFrom
    from tandem.parallel.tensor import parallelize

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world,))
    from safetensors.torch import load_file

    x = torch.load(Path(out, "x.pt"), weights_only=True)
    plain = _model()  # the plain model, run with this process's threads
    plain.load_state_dict(load_file(sources[0]))
    with torch.no_grad():
        found = {"plain": (plain(x), 0)}
    for split in ("fsdp", "tp"):
        for i, source in enumerate(sources):
            torch.manual_seed(100 + rank)  # different on each rank: the load must set all
            model = _model()
            if split == "fsdp":
                for layer in (model[0], model[2]):
                    fully_shard(layer, mesh=mesh)
                fully_shard(model, mesh=mesh)
            else:
                parallelize(model, PLAN, mesh)
            loader = InitFrom(source)
            loader.load(model)
            with torch.no_grad():
                outputs = model(x)
                found[f"{split}{i}"] = (torch.tensor(outputs.tolist()), loader.bytes_read)
    torch.save(found, Path(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_safetensors_load_into_fsdp2_and_tp_reads_each_ranks_shard_only(
        tmp_path: Path) -> None:
    torch.manual_seed(11)
    plain = _model()
    state = {k: v.contiguous() for k, v in plain.state_dict().items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    folder = tmp_path / "sharded"  # and as two shards with an index
    folder.mkdir()
    shard = {k: "model-00001-of-00002.safetensors" if k.startswith("0.")
             else "model-00002-of-00002.safetensors" for k in state}
    for file in set(shard.values()):
        save_file({k: v for k, v in state.items() if shard[k] == file}, str(folder / file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shard}))
    x = torch.randn(5, 16)
    torch.save(x, tmp_path / "x.pt")
    sources = [str(tmp_path / "model.safetensors"), str(folder)]
    run_ranks(_leg, 2, str(tmp_path), sources, timeout=150)
    whole = sum(v.numel() * v.element_size() for v in state.values())
    for rank in range(2):
        found = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        expected = found["plain"][0]
        torch.testing.assert_close(expected, plain(x).detach(), rtol=1e-6, atol=1e-7)
        for split in ("fsdp", "tp"):
            want = _expected_bytes(state, rank, 2, split)
            for i in range(len(sources)):
                outputs, read = found[f"{split}{i}"]
                if split == "fsdp":  # the weights gathered: the same arithmetic as plain
                    assert torch.equal(outputs, expected), (rank, split, i)
                else:  # the row-wise layer sums its partial products across ranks
                    torch.testing.assert_close(outputs, expected, rtol=1e-6, atol=1e-6)
                assert read == want, (rank, split, i, read, want)
            # about half the model: a rank never read a full copy of a split tensor
            assert want < 0.55 * whole, (split, want, whole)
