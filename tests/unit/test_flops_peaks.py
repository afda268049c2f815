"""Data-sheet peaks are matched to the card by whole words, the specific card first."""

from __future__ import annotations

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
