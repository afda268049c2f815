"""`tandem plan`: the meta-device profile against hand-counted figures, the memory and
time model against its formulas, and the command end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tandem.planner.layouts import Layout, Setting, estimate, plan, stages
from tandem.planner.machine import GIB, Machine, parse_machine
from tandem.planner.profile import profile

ROOT = Path(__file__).resolve().parents[2]


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def _profile():  # noqa: ANN202
    return profile(Mlp, torch.randn(3, 8), 3, lambda m, b: m(b).square().mean())


def test_profile_counts_parameters_flops_and_saved_activations_per_sample() -> None:
    units = {u.name: u for u in _profile().units}
    # Linear(8,16): 8*16+16 parameters, 2*8*16 FLOPs, keeps its input (8 floats);
    # ReLU keeps its output (16 floats), which is also the second Linear's input (kept
    # once); the loss's square keeps the 4 outputs (counted with the last unit).
    assert (units["blocks.0"].params, units["blocks.0"].flops) == (144, 256)
    assert units["blocks.0"].saved_bytes == 8 * 4
    assert units["blocks.1"].saved_bytes == 16 * 4
    assert (units["blocks.2"].params, units["blocks.2"].flops) == (68, 2 * 16 * 4)
    assert units["blocks.2"].saved_bytes == 4 * 4
    assert not any(p.device.type != "cpu" for p in Mlp().parameters())  # nothing leaked


def test_attention_counts_as_a_fused_kernel() -> None:
    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(8, 24, bias=False), nn.Identity()])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.blocks[0](x).view(1, 6, 3, 2, 4).unbind(2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    unit = profile(Attn, torch.randn(1, 6, 8), 1, lambda m, b: m(b).sum()).units[0]
    # q, k, v, the output (2 heads x 6 positions x 4) and one float per query and head;
    # plus the Linear's input (6 x 8). Never the 2 x 6 x 6 probabilities.
    assert unit.saved_bytes == (4 * 48 + 12 + 48) * 4
    assert unit.flops == 2 * 6 * 8 * 24 + 2 * (48 * 6 + 48 * 6)


def test_state_memory_splits_over_fsdp_and_tp_as_the_formulas_say() -> None:
    prof = _profile()
    machine = Machine("test", 4, 4, 1 * GIB, 1e9, 1e9, 1e9)
    setting = Setting(global_batch=8, optimizer_states=2, bf16=False, efficiency=0.5)
    params = 144 + 68
    one = estimate(prof, Layout(1, 1, 1, 1, 8, False), machine, setting)
    assert one.memory["weights"] == params * 4 and one.memory["optimizer"] == params * 8
    sharded = estimate(prof, Layout(1, 1, 4, 1, 2, False), machine, setting)
    assert sharded.memory["weights"] == params * 4 / 4
    assert sharded.memory["gathered"] == (144 + 68) * 4  # the two largest units, fp32
    # One process: 3 x forward FLOPs per sample x 8 samples at half of 1 GFLOP/s.
    assert one.step_s == pytest.approx(3 * (256 + 128) * 8 / 0.5e9)


def test_pipeline_stages_balance_the_slowest_and_keep_micro_batches_in_flight() -> None:
    prof = _profile()
    cut = stages(prof, 2)
    # Forward FLOPs 256, 0 (the ReLU), 128: the slowest stage cannot go below 256.
    assert [[u.name for u in s] for s in cut] == [["blocks.0"], ["blocks.1", "blocks.2"]]
    machine = Machine("test", 2, 2, 1 * GIB, 1e9, 1e9, 1e9)
    setting = Setting(global_batch=8, optimizer_states=2, bf16=False, efficiency=0.5)
    pipe = estimate(prof, Layout(2, 1, 1, 1, 2, False), machine, setting)
    # The first stage needs most (its 144 parameters' state): 1F1B keeps min(m, pp) = 2
    # of its micro-batches of 2 samples in flight, each keeping 8 floats a sample.
    assert pipe.memory["activations"] == 2 * 2 * 8 * 4
    # The slowest stage's compute x (m + pp - 1) / m, m = 4.
    assert pipe.time_parts["compute"] == pytest.approx(3 * 256 * 8 / 0.5e9 * 5 / 4)
    refused = estimate(prof, Layout(2, 1, 1, 1, 8, False), machine, setting)
    assert not refused.fits and "fewer than the 2 stages" in refused.why


def test_a_layout_that_does_not_fit_says_how_much_it_needs() -> None:
    prof = _profile()
    tiny = Machine("tiny", 1, 1, 1000.0, 1e9, 1e9, 1e9)
    found = plan(prof, tiny, Setting(8, 2, False, 0.5))
    assert not found[0].fits and "GiB per device" in found[0].why


def test_machine_names_are_checked() -> None:
    machine = parse_machine("64xH100-80GB")
    assert (machine.devices, machine.per_node, machine.nodes) == (64, 8, 8)
    with pytest.raises(ValueError, match="NxKIND"):
        parse_machine("8xTPU")


@pytest.mark.timeout(120)
def test_plan_command_lists_layouts_for_a_llama_8b_on_eight_gpus() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "plan", str(ROOT / "examples" / "llm_plan.py"),
         "--task", "llama3_8b", "--global-batch", "16", "--machine", "8xH100-80GB"],
        capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "8,030.3 M parameters" in out.stdout
    assert "fsdp8" in out.stdout and "yes" in out.stdout


class TpBlock(nn.Module):
    """norm -> fc (column-parallel) -> relu -> proj (row-parallel)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.fc, self.proj = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.fc(self.norm(x))))


class TpMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([TpBlock(), TpBlock()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[1](self.blocks[0](x))


def test_tensor_parallel_splits_only_what_lies_between_column_and_row_layers() -> None:
    plan = {"blocks.*.fc": "colwise", "blocks.*.proj": "rowwise"}
    unit = profile(TpMlp, torch.randn(2, 8), 2, lambda m, b: m(b).square().mean(),
                   plan).units[0]
    # Kept: the norm's input (8) and its per-row mean and rstd (1 + 1), the fc's input (the
    # norm's output, 8: whole on every peer), the ReLU's output (32, also proj's input:
    # split). Proj's output (whole after its all-reduce) is the next block's to keep.
    assert unit.saved_bytes == (8 + 2 + 8 + 32) * 4
    assert unit.tp_saved_bytes == 32 * 4
    assert (unit.largest_bytes, unit.tp_largest_bytes) == (8 * 4, 32 * 4)
    machine = Machine("test", 2, 2, 1 * GIB, 1e9, 1e9, 1e9)
    setting = Setting(global_batch=4, optimizer_states=2, bf16=False, efficiency=0.5)
    prof = profile(TpMlp, torch.randn(2, 8), 2, lambda m, b: m(b).square().mean(), plan)
    tp = estimate(prof, Layout(1, 1, 1, 2, 4, False), machine, setting)
    # Two blocks, the last also keeping the loss's input (8, whole).
    assert tp.memory["activations"] == 4 * (2 * (8 + 2 + 8 + 32 / 2) + 8) * 4
    assert tp.memory["backward working"] == 4 * max(8, 32 / 2) * 4


def test_fsdp_accumulates_whole_gradients_and_ddp_adds_its_buckets() -> None:
    prof = _profile()
    machine = Machine("test", 2, 2, 1 * GIB, 1e9, 1e9, 1e9)
    setting = Setting(global_batch=8, optimizer_states=2, bf16=False, efficiency=0.5)
    params = 144 + 68
    accum = estimate(prof, Layout(1, 1, 2, 1, 2, False), machine, setting)  # 2 micro-batches
    assert accum.memory["gradients"] == params * 4  # held whole until the last one
    once = estimate(prof, Layout(1, 1, 2, 1, 4, False), machine, setting)
    assert once.memory["gradients"] == params * 4 / 2
    ddp = estimate(prof, Layout(1, 2, 1, 1, 4, False), machine, setting)
    assert ddp.memory["ddp buckets"] == params * 4
    pipe = estimate(prof, Layout(2, 1, 1, 1, 2, False), machine, setting)
    # The first stage (144 parameters) holds the rest of the model (68) too, and one
    # receive buffer per micro-batch (4) for its output's gradient (a block input: 8 floats).
    assert pipe.memory["whole model"] == 68 * 4
    assert pipe.memory["pipeline buffers"] == 4 * 2 * 8 * 4


def test_fsdp_gathers_each_micro_batch_and_reduce_scatters_once() -> None:
    """What FSDP2 sends in a step, by the rule `parallel.fsdp.bytes_per_step` follows (and
    tests/dist/test_planner_collectives.py checks against a real step's collectives): each
    block's unit gathered for every micro-batch's forward and backward, the gradients
    reduce-scattered once; with the link's time as the only cost, the planner's
    communication time is those bytes over the link."""
    prof = _profile()  # two blocks with parameters, nothing outside them
    params = 144 + 68
    link = 1e3  # bytes/s: slow enough that communication is the step
    machine = Machine("test", 2, 2, 1 * GIB, 1e12, link, link)
    setting = Setting(global_batch=8, optimizer_states=2, bf16=False, efficiency=1.0)
    for micro in (4, 2, 1):  # 1, 2 and 4 micro-batches a step
        m = 8 // 2 // micro
        got = estimate(prof, Layout(1, 1, 2, 1, micro, False), machine, setting)
        sent = 0.5 * (2 * m * params * 4 + params * 4)
        compute = got.time_parts["compute"]
        assert got.time_parts["data-parallel (exposed)"] + compute == pytest.approx(sent / link)


def test_orthogonalisation_flops_are_those_torch_counts_in_muon() -> None:
    """The planner's Newton-Schulz FLOPs against torch's own count of `orthogonalize`."""
    from torch.utils.flop_counter import FlopCounterMode

    from tandem.optim.muon import orthogonalize
    from tandem.planner.layouts import orthogonalisation_flops

    for shape in ((12, 40), (40, 12), (16, 16)):
        with FlopCounterMode(display=False) as counter:
            orthogonalize(torch.randn(*shape), steps=3)
        assert orthogonalisation_flops(shape, 3) == counter.get_total_flops()


def test_collectives_cost_their_fixed_time_hidden_on_gpus_and_added_on_a_cpu_host() -> None:
    """Each collective costs `collective_s` besides its bytes: FSDP's 2m gathers per
    block, m for the root and a reduce-scatter per unit; a GPU hides them behind the
    compute, a CPU host (`overlaps=False`) adds them to it. Muon's matrices are gathered
    and orthogonalised whole under FSDP."""
    from tandem.planner.layouts import orthogonalisation_flops

    prof = _profile()  # two blocks with parameters (the ReLU between has none), no root
    cost = 1e-3
    # Compute (92 ms a step at 50 kFLOP/s) longer than the collectives (10 ms).
    cpu = Machine("cpu", 2, 2, 1 * GIB, 1e5, 1e15, 1e15, collective_s=cost, overlaps=False)
    gpu = Machine("gpu", 2, 2, 1 * GIB, 1e5, 1e15, 1e15, collective_s=cost)
    setting = Setting(global_batch=8, optimizer_states=2, bf16=False, efficiency=0.5)
    fsdp = Layout(1, 1, 2, 1, 2, False)  # 2 micro-batches of 2 on each of 2 shards
    exposed = estimate(prof, fsdp, cpu, setting).time_parts["data-parallel (exposed)"]
    assert exposed == pytest.approx(2 * (2 * 2 + 1) * cost, rel=1e-6)
    hidden = estimate(prof, fsdp, gpu, setting).time_parts
    assert hidden["compute"] > 10 * cost and hidden["data-parallel (exposed)"] == 0.0
    muon = Setting(8, 1, False, 0.5, orthogonalised=((16, 8), (4, 16)), ns_steps=5)
    plain = estimate(prof, Layout(1, 1, 1, 1, 4, False), cpu, muon).time_parts["optimizer"]
    flops = orthogonalisation_flops((16, 8), 5) + orthogonalisation_flops((4, 16), 5)
    assert plain == pytest.approx(flops / 0.5e5, rel=1e-6)
    sharded = estimate(prof, fsdp, cpu, muon).time_parts["optimizer"]
    assert sharded == pytest.approx(flops / 0.5e5 + 2 * cost, rel=1e-6)
