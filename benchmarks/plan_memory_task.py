"""The char-LM example's task, its tensor memory traced: `benchmarks/plan_memory.py`'s runs.

The first build of the model starts torch's profiler with memory profiling, so every
tensor the process allocates and frees from then on (the model, its shards or stage
copies, wrappers' buffers, optimizer state, gradients, activations, temporaries) is in
the trace; after optimizer step `PEAK_STEPS` a component stops it and writes the highest
sum of live bytes to `PEAK_DIR/<rank>.json`.

The live bytes are replayed from the allocator's own records (address and size of each
allocation and free, in time order), not from the ops' net memory: a free on a thread the
profiler does not watch (a collective's) goes unrecorded, so a later allocation at the
same address replaces the stale entry instead of counting twice.
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


def peak_bytes(trace: Any) -> int:
    """The highest sum of live allocations in the profiler's `trace`, replayed by address
    in order of time."""
    from torch._C._profiler import _EventType

    stack, allocations = list(trace.profiler.kineto_results.experimental_event_tree()), []
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation:
            allocations.append((event.start_time_ns, event.extra_fields))
    live: dict[int, int] = {}
    total = peak = 0
    for _, fields in sorted(allocations, key=lambda a: a[0]):
        total -= live.pop(fields.ptr, 0)  # freed, or its free was never recorded
        if fields.alloc_size > 0:
            live[fields.ptr] = fields.alloc_size
            total += fields.alloc_size
        peak = max(peak, total)
    return peak


class PeakMemory(tandem.Component):
    """Stops the trace after step PEAK_STEPS and writes this rank's peak live bytes."""

    def after_step(self, step: int, skipped: bool) -> None:
        if step != int(os.environ["PEAK_STEPS"]) or not _TRACE:
            return
        _TRACE[0].stop()
        rank = int(os.environ.get("RANK", "0"))
        Path(os.environ["PEAK_DIR"], f"{rank}.json").write_text(
            json.dumps({"peak_bytes": peak_bytes(_TRACE[0])}))


task = dataclasses.replace(char_lm.task, model=model, optimizer=char_lm.optimizer,
                           components=lambda: [PeakMemory()])


if __name__ == "__main__":
    tandem.fit(task)
