"""Compression in one process: low-rank factorisation against an independent truncated
SVD, int8 fake quantisation against its formula and its conversion, channel pruning's
masked model against the model with those channels removed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tandem
from tandem.compress import lowrank, measure, prune, quant
from tests.dist import toy_task


def _best_rank(w: torch.Tensor, r: int) -> torch.Tensor:
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    return u[:, :r] @ torch.diag(s[:r]) @ vh[:r]


def test_a_factorised_linear_is_the_best_rank_r_approximation() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 30), nn.ReLU(), nn.Linear(30, 4))
    w = model[0].weight.detach().clone()
    chosen = lowrank.factorise(model, params=0.5, skip=("2",))
    r = chosen["0"]
    assert r == int(0.5 * 40 * 30 / 70) and "2" not in chosen
    pair = model[0]
    torch.testing.assert_close(pair[1].weight @ pair[0].weight, _best_rank(w, r),
                               rtol=1e-4, atol=1e-5)
    assert sum(p.numel() for p in pair.parameters()) < 40 * 30 + 30


def test_a_factorised_conv_keeps_its_output_at_full_energy_and_energy_picks_the_rank() -> None:
    torch.manual_seed(1)
    conv = nn.Conv1d(8, 32, 5, padding=2)
    model = nn.Sequential(conv)
    x = torch.randn(3, 8, 20)
    want = conv(x)
    s = torch.linalg.svdvals(conv.weight.detach().reshape(32, -1))
    energy = (s ** 2).cumsum(0) / (s ** 2).sum()
    expected = int((energy < 0.6).sum()) + 1  # the first rank that keeps 60%
    assert lowrank.rank_for(s, (32, 40), 0.6, None) == expected
    lowrank.factorise(model, energy=0.9999999)
    # the rank-8 pair of a 32 x 40 matrix of rank 32 is not smaller: left whole
    assert model[0] is conv
    wide = nn.Sequential(nn.Conv1d(64, 64, 3, padding=1))
    w = wide[0].weight.detach().reshape(64, -1)
    y = torch.randn(2, 64, 10)
    lowrank.factorise(wide, params=0.3)
    r = wide[0][0].out_channels
    reference = nn.functional.conv1d(y, _best_rank(w, r).reshape(64, 64, 3),
                                     wide[0][1].bias, padding=1)
    torch.testing.assert_close(wide(y), reference, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model(x), want)
    with pytest.raises(ValueError, match="exactly one of energy= or params="):
        lowrank.factorise(model)


def test_fake_quant_follows_its_formula_and_passes_the_gradient_straight() -> None:
    x = torch.tensor([-1.0, 0.013, 0.5, 2.0], requires_grad=True)
    scale = torch.tensor(0.01)
    y = quant.fake_quant(x, scale, 0.0, -127, 127)
    expected = torch.clamp(torch.round(x.detach() / 0.01), -127, 127) * 0.01
    torch.testing.assert_close(y, expected)
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(4))


def test_converted_int8_layers_compute_what_the_fake_quantised_model_computed() -> None:
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv1d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 12, 5))
    with pytest.raises(ValueError, match="no Linear or ConvNd"):
        quant.QuantAware().transform_model(nn.Sequential(nn.ReLU()), torch.device("cpu"))
    assert quant.prepare(model) == ["0", "3"]
    with pytest.raises(ValueError, match="never saw an input"):
        quant.convert(model)
    data = torch.randn(16, 1, 12)
    model.eval()
    with torch.no_grad(), quant.calibrating(model):
        model(data)
    lo, hi = model[3].act_range
    flat = nn.functional.relu(nn.functional.conv1d(
        quant.fake_quant(data, *quant.act_params(data.min(), data.max()), 0, 255),
        quant.fake_quant(model[0].layer.weight, quant.weight_scale(model[0].layer.weight),
                         0.0, -127, 127), model[0].layer.bias, padding=1)).flatten(1).detach()
    assert float(lo) == pytest.approx(float(flat.min()), abs=1e-6)
    assert float(hi) == pytest.approx(float(flat.max()), rel=1e-5)
    with torch.no_grad():
        fake = model(data)
        quant.convert(model)
        assert model[0].weight_int8.dtype == torch.int8
        torch.testing.assert_close(model(data), fake, rtol=1e-5, atol=1e-6)
    program = torch.export.export(model, (data,))
    torch.testing.assert_close(program.module()(data), fake, rtol=1e-5, atol=1e-6)


def test_pruned_channels_removed_give_the_masked_models_outputs() -> None:
    pytest.importorskip("torch_pruning", reason="torch-pruning is in the dev extra")
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 12), nn.ReLU(),
                          nn.Linear(12, 3))
    x = torch.randn(4, 10)
    masked = prune.choose(model, x, 0.5, keep=("4",))
    assert {k: len(v) for k, v in masked.items()} == {"0": 8, "2": 6}
    # the lowest group L2 norms go first: layer 0's channel norms with layer 2's columns
    group = (model[0].weight.detach() ** 2).sum(1) + model[0].bias.detach() ** 2 \
        + (model[2].weight.detach() ** 2).sum(0)
    assert masked["0"] == sorted(group.argsort()[:8].tolist())
    prune.apply(model, x, masked)
    want = model(x).detach()
    prune.remove(model, x, masked)  # traces the graph: autograd on
    assert (model[0].out_features, model[2].in_features, model[2].out_features) == (8, 8, 6)
    torch.testing.assert_close(model(x).detach(), want, rtol=1e-5, atol=1e-6)
    assert prune.cubic(0, 0.5, 0, 10) == 0 and prune.cubic(10, 0.5, 0, 10) == 0.5
    assert prune.cubic(5, 0.5, 0, 10) == pytest.approx(0.5 * (1 - 0.5 ** 3))


class Residual(nn.Module):
    """An embedding on a residual stream that a block adds to, then a hidden layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.block = nn.Linear(8, 8)
        self.hidden = nn.Linear(8, 16)
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        h = h + self.block(h)
        return self.out(torch.relu(self.hidden(h)))


def test_groups_tied_to_a_residual_stream_are_named_and_the_others_prune() -> None:
    pytest.importorskip("torch_pruning", reason="torch-pruning is in the dev extra")
    torch.manual_seed(4)
    model, x = Residual(), torch.randint(0, 10, (5,))
    assert prune.tied(model, x, keep=("out",)) == ["block"]
    with pytest.raises(ValueError, match="Embedding is coupled to pruned channels"):
        prune.apply(model, x, prune.choose(model, x, 0.5, keep=("out",)))
    masked = prune.choose(model, x, 0.5, keep=("out", "block"))
    assert {k: len(v) for k, v in masked.items()} == {"hidden": 8}


def test_the_components_train_in_a_run(tmp_path) -> None:
    """QuantAware and ChannelPruning as run components of the toy task: the trained model
    comes back fake-quantised and converts; pruning reaches its share on schedule and the
    masked channels stay zero through the optimizer's updates."""
    pytest.importorskip("torch_pruning", reason="torch-pruning is in the dev extra")
    cfg = toy_task.config(str(tmp_path / "q"), 6, 20)
    model = tandem.fit(toy_task.task(), config=cfg, components=[quant.QuantAware()]).model
    assert quant.quantised_names(model) == ["0", "2"]
    x = torch.randn(5, 12)
    model.eval()
    with torch.no_grad():
        fake = model(x)
        torch.testing.assert_close(quant.convert(model)(x), fake, rtol=1e-5, atol=1e-6)
    pruning = prune.ChannelPruning(torch.randn(2, 12), ratio=0.5, start=1, end=4, keep=("2",))
    cfg = toy_task.config(str(tmp_path / "p"), 6, 20)
    model = tandem.fit(toy_task.task(), config=cfg, components=[pruning]).model
    assert pruning.metrics()["pruned_share"] == 0.5
    rows = pruning.masked["0"]
    assert len(rows) == 16 and not model[0].weight[rows].any()
    assert not model[2].weight[:, rows].any()


def test_a_weight_tied_to_an_embedding_is_left_whole() -> None:
    """The tied output layer would grow: the embedding keeps the full matrix."""
    torch.manual_seed(3)
    embed, body, head = nn.Embedding(50, 40), nn.Linear(40, 40), nn.Linear(40, 50, bias=False)
    head.weight = embed.weight
    model = nn.ModuleDict({"embed": embed, "body": body, "head": head})
    before = sum(p.numel() for p in model.parameters())
    assert set(lowrank.factorise(model, params=0.3)) == {"body"}
    assert model["head"].weight is model["embed"].weight
    after = sum(p.numel() for p in model.parameters())
    assert before - after == 40 * 40 - lowrank.rank_for(torch.ones(1), (40, 40), None, 0.3) * 80
    # nor is it quantised: an int8 copy would add to the embedding's float matrix
    assert quant.prepare(model) == ["body.0", "body.1"]


def test_int4_weights_are_quantised_per_group_of_32_and_convert_exactly() -> None:
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 3))
    assert quant.prepare(model, bits=4, group=32, activations=False) == ["0", "2"]
    w = model[0].layer.weight.detach()
    blocks = w.reshape(16, 2, 32)  # two groups of 32 inputs per output channel
    scale = blocks.abs().amax(-1, keepdim=True) / 7
    want = ((blocks / scale).round().clamp(-7, 7) * scale).reshape(16, 64)
    torch.testing.assert_close(quant.fake_weight(w, 4, 32), want)
    assert len(torch.unique(quant.fake_weight(w, 4, 32)[0, :32])) <= 15
    # 16 inputs: 32 does not divide them, so the whole channel shares a scale
    w2 = model[2].layer.weight.detach()
    s2 = w2.abs().amax(1, keepdim=True) / 7
    torch.testing.assert_close(quant.fake_weight(w2, 4, 32),
                               (w2 / s2).round().clamp(-7, 7) * s2)
    x = torch.randn(5, 64)
    with torch.no_grad():
        fake = model(x)  # weights-only: no input range needed before converting
        quant.convert(model)
        assert int(model[0].weight_int8.abs().max()) <= 7
        torch.testing.assert_close(model(x), fake, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="weight bits 1"):
        quant.prepare(nn.Linear(4, 4), bits=1)


def test_the_int8_linear_layers_run_on_fbgemm_kernels_and_export_as_their_emulation() -> None:
    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv1d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 5))
    data = torch.randn(20, 1, 12)
    quant.prepare(model)
    model.eval()
    with torch.no_grad(), quant.calibrating(model):
        model(data)
    quant.convert(model)
    q, s = model[3].weight_int8.clone(), model[3].weight_scale.flatten().clone()
    assert quant.kernels(model) == ["3", "5"]  # the convolution stays as converted
    assert quant.has_kernels(model) and isinstance(model[0], quant.Int8Layer)
    kernel = model[3]
    assert torch.equal(kernel.weight().int_repr(), q)
    torch.testing.assert_close(kernel.weight().q_per_channel_scales().float(), s)
    # fbgemm's dynamic int8 GEMM: the input to 7-bit unsigned over its own range
    x = torch.randn(7, 48)
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    step = (hi - lo) / 127
    zero = round(-lo / step)
    xq = ((x / step).round() + zero).clamp(0, 127)
    want = ((xq - zero) * step) @ (q.float() * s[:, None]).T + kernel.bias()
    with torch.no_grad():
        torch.testing.assert_close(kernel(x), want, rtol=1e-4, atol=1e-4)
        fast = model(data)
        twin = quant.emulated(model)
        assert not quant.has_kernels(twin)
        torch.testing.assert_close(twin(data), fast, rtol=1e-4, atol=1e-5)
    program = torch.export.export(twin, (data,))
    torch.testing.assert_close(program.module()(data), fast, rtol=1e-4, atol=1e-5)
    assert measure.weights(model) == 4 * 3 + 4 + 48 * 32 + 32 + 32 * 5 + 5
