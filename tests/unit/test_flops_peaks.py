"""Data-sheet peaks are matched to the card by whole words, the specific card first."""

from __future__ import annotations

import json

import pytest
import torch

from tandem.monitor import flops


@pytest.mark.parametrize(("name", "precision", "tf32", "peak"), [
    ("NVIDIA H100 80GB HBM3", "bf16", False, 989e12),
    ("NVIDIA H100 PCIe", "bf16", False, 756e12),
    ("NVIDIA H200", "fp32", False, 67e12),
    ("NVIDIA H200", "fp32", True, 494e12),
    ("NVIDIA L40S", "bf16", False, 362e12),
    ("NVIDIA L40", "fp16", False, 181e12),
    ("NVIDIA L4", "bf16", False, 121e12),
])
def test_the_card_named_gets_its_own_peak(monkeypatch: pytest.MonkeyPatch, name: str,
                                          precision: str, tf32: bool, peak: float) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        found, source = flops.peak_flops(torch.device("cuda", 0), precision)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert found == peak and source.startswith("data sheet")


def test_a_measured_peak_is_measured_once_per_machine(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path) -> None:
    """The CPU probe runs on the first call only; later calls (later runs) read the file,
    a corrupt file is measured again, and a low probe never lowers what is kept."""
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    probes = iter([50e9, 40e9, 70e9])
    calls: list[float] = []

    def probe(device: torch.device, precision: str) -> float:
        calls.append(next(probes))
        return calls[-1]

    monkeypatch.setattr(flops, "measure_matmul", probe)
    cpu = torch.device("cpu")
    first = flops.peak_flops(cpu, "fp32")
    assert first == (50e9, "measured matmul (cpu, fp32)") and len(calls) == 1
    again = flops.peak_flops(cpu, "fp32")
    assert again == (50e9, "measured matmul (cpu, fp32, cached)") and len(calls) == 1
    (tmp_path / flops.PEAKS_FILE).write_text("{not json")
    assert flops.peak_flops(cpu, "fp32")[0] == 40e9 and len(calls) == 2
    # a probe slowed by a neighbour does not lower the kept peak
    flops._keep(flops.PEAKS_FILE, flops._machine_key(cpu, "fp32"), 30e9, larger=True)
    assert flops.peak_flops(cpu, "fp32")[0] == 40e9
    other = torch.get_num_threads() + 1  # another thread count is another key
    before = torch.get_num_threads()
    torch.set_num_threads(other)
    try:
        assert flops.peak_flops(cpu, "fp32") == (70e9, "measured matmul (cpu, fp32)")
    finally:
        torch.set_num_threads(before)
    assert len(calls) == 3 and len(json.loads((tmp_path / flops.PEAKS_FILE).read_text())) == 2
