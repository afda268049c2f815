"""Moments on the host clock or the device's stream, for intervals measured across threads."""

from __future__ import annotations

import time

import torch

Mark = float | torch.cuda.Event  # a moment: host clock, or an event on the device


def mark(on_device: bool) -> Mark:
    """Now, as a host clock reading or (on CUDA) an event recorded on the current stream."""
    if on_device:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()
