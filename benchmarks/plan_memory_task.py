"""The char-LM example's task, its tensor memory traced: `benchmarks/plan_memory.py`'s runs.

The first build of the model starts torch's profiler with memory profiling, so every
tensor the process allocates and frees from then on (the model, its shards or stage
copies, wrappers' buffers, optimizer state, gradients, activations, temporaries) is in
the trace; after optimizer step `PEAK_STEPS` a component stops it and writes the highest
sum of live bytes to `PEAK_DIR/<rank>.json`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import char_lm  # noqa: E402

import tandem  # noqa: E402

_TRACE: list[Any] = []  # the running profiler, once the model is first built


def model() -> torch.nn.Module:
    """The example's model, the trace started before its first build."""
    if not _TRACE and "PEAK_DIR" in os.environ:  # a traced run, not the planner's profile
        _TRACE.append(profile(activities=[ProfilerActivity.CPU], profile_memory=True))
        _TRACE[0].start()
    return char_lm.CharLM()


def peak_bytes(events: Any) -> int:
    """The highest running sum of the allocations (+) and frees (-) in `events`, in
    order of time (each op's own share: its children count for themselves)."""
    live = peak = 0
    for _, size in sorted((e.time_range.start, e.self_cpu_memory_usage) for e in events
                          if e.self_cpu_memory_usage):
        live += size
        peak = max(peak, live)
    return peak


class PeakMemory(tandem.Component):
    """Stops the trace after step PEAK_STEPS and writes this rank's peak live bytes."""

    def after_step(self, step: int, skipped: bool) -> None:
        if step != int(os.environ["PEAK_STEPS"]) or not _TRACE:
            return
        _TRACE[0].stop()
        rank = int(os.environ.get("RANK", "0"))
        Path(os.environ["PEAK_DIR"], f"{rank}.json").write_text(
            json.dumps({"peak_bytes": peak_bytes(_TRACE[0].events())}))


task = dataclasses.replace(char_lm.task, model=model, optimizer=char_lm.optimizer,
                           components=lambda: [PeakMemory()])


if __name__ == "__main__":
    tandem.fit(task)
