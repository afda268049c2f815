"""The char-LM's training step under three precisions, side by side in one process.

    python benchmarks/attention_precision.py --rounds 6 --steps 10

Arms (one process, one thread, the model, batch and optimizer of `examples/char_lm.py`:
16 windows of 128 bytes, the per-process batch of its 2-process recipe; AdamW, grad clip 1):

* fp32: no autocast;
* bf16, attention by autocast: `precision.mode bf16 --precision.attention autocast`, what a
  hand-written loop under `torch.autocast("cpu", torch.bfloat16)` runs;
* bf16, attention in fp32: `precision.mode bf16`, tandem's default on CPU.

The arms alternate in blocks of `--steps` steps (the order rotating each round, after two
warm-up steps per arm); each block's median step time is one sample. Then one profiled
block per arm gives the attention kernels' time per step, forward and backward. Prints the
median step time per arm, each arm's ratio to the bf16-by-autocast arm round by round, and
the kernel times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from tandem.config import PrecisionConfig
from tandem.trainer.precision import Precision

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
from recipe import char_lm_module  # noqa: E402

ARMS = {"fp32": ("fp32", "auto"), "bf16, attention by autocast": ("bf16", "autocast"),
        "bf16, attention in fp32 (default)": ("bf16", "auto")}
BASE = "bf16, attention by autocast"


class Arm:
    """One precision's model, optimizer and step (every arm starts from the same weights)."""

    def __init__(self, lm: Any, mode: str, attention: str, batch: int) -> None:
        torch.manual_seed(0)
        self.model = lm.CharLM()
        self.optimizer = lm.optimizer(self.model.parameters())
        self.precision = Precision(PrecisionConfig(mode=mode, attention=attention),
                                   torch.device("cpu"))
        g = torch.Generator().manual_seed(1)
        self.x = torch.randint(0, lm.VOCAB, (batch, lm.SEQ_LEN), generator=g)
        self.y = torch.randint(0, lm.VOCAB, (batch, lm.SEQ_LEN), generator=g)

    def step(self) -> float:
        start = time.perf_counter()
        with self.precision.autocast():
            logits = self.model(self.x)
        loss = F.cross_entropy(logits.flatten(0, -2).float(), self.y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start


def attention_ms(arm: Arm, steps: int) -> tuple[float, float]:
    """Forward and backward attention kernels' self time per step, in ms."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            arm.step()
    fwd = bwd = 0.0
    for event in prof.key_averages():
        if "scaled_dot_product" in event.key and event.key.startswith("aten::_"):
            if "backward" in event.key:
                bwd += event.self_cpu_time_total
            else:
                fwd += event.self_cpu_time_total
    return fwd / 1e3 / steps, bwd / 1e3 / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    parser.add_argument("--batch", type=int, default=16)
    ns = parser.parse_args()
    torch.set_num_threads(1)
    lm = char_lm_module()
    arms = {name: Arm(lm, *cfg, ns.batch) for name, cfg in ARMS.items()}
    for arm in arms.values():
        arm.step(), arm.step()
    names = list(arms)
    blocks: dict[str, list[float]] = {n: [] for n in names}
    for r in range(ns.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            blocks[name].append(statistics.median(arms[name].step() for _ in range(ns.steps)))
    print(f"char-LM step, batch {ns.batch} x {lm.SEQ_LEN}, 1 thread, {ns.rounds} rounds of "
          f"{ns.steps} steps per arm\n")
    print("| arm | step ms, median [min-max] of blocks | speed / bf16 by autocast, round by "
          "round | attention fwd / bwd ms per step |\n| --- | --- | --- | --- |")
    for name in names:
        ms = [1e3 * b for b in blocks[name]]
        ratios = [b / a for a, b in zip(blocks[name], blocks[BASE], strict=True)]
        fwd, bwd = attention_ms(arms[name], ns.steps)
        print(f"| {name} | {statistics.median(ms):.1f} [{min(ms):.1f}-{max(ms):.1f}] | "
              f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] | "
              f"{fwd:.1f} / {bwd:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
