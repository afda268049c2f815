"""Subnormal floats: the MNIST-1D model's step, plain torch against tandem's runtime.

A model that has fitted its data gives the wrong classes softmax probabilities below
float32's smallest normal number (1.2e-38) once its logit margins pass about 87, and its
backward pass then computes on subnormals, which x86 does in microcode. The dashboard's
overhead benchmark saw it: its 2-process run of the example, at 68 steps a second, went
from about 11 ms to 38 ms of compute a step after 35 minutes, with nothing else changed.

Getting there takes that long, so this benchmark takes the state's defining property
instead: the example's model, trained for `--fit-steps` on MNIST-1D, then its classifier
scaled so that the median logit margin is `--margin` (87 is where subnormals begin; the
long run's own margins were not recorded). It times the training step (forward,
backward, optimizer) in blocks, alternating plain torch (IEEE subnormals, torch's
default) and tandem's runtime (`plan.flush_denormal`, on by default; its allocator
setting left out), each block from the same weights; then the same with the unscaled
model, where no subnormal arises, as the control: the flag must cost nothing there.

    python benchmarks/denormal.py            # about 30 s
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "examples"))

from mnist1d_model import MNIST1D, make_model, make_muon  # noqa: E402

from tandem.config.schema import PlanConfig  # noqa: E402
from tandem.runtime import start, stop  # noqa: E402


def margins(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each sample's logit of its class minus the largest other logit."""
    with torch.no_grad():
        logits = model(x)
    own = logits.gather(1, y[:, None]).squeeze(1)
    others = logits.masked_fill(nn.functional.one_hot(y, logits.shape[1]).bool(), -torch.inf)
    return own - others.max(1).values


def block_ms(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int,
             batch: int, tandem: bool) -> float:
    """Median ms of `steps` training steps of a copy of `model`, plain or under tandem."""
    work = copy.deepcopy(model)
    opt = make_muon(work.parameters())
    gen = torch.Generator().manual_seed(0)
    # glibc's allocator threshold left alone: set once, it would hold for both arms after
    # the first tandem block; the arms differ only in the flag
    runtime = start(PlanConfig(device="cpu", malloc_threshold_mb=0)) if tandem else None
    try:
        times = []
        for _ in range(steps):
            idx = torch.randint(0, len(x), (batch,), generator=gen)
            began = time.perf_counter()
            loss = nn.functional.cross_entropy(work(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - began)
    finally:
        if runtime is not None:
            stop(runtime)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit-steps", type=int, default=300)
    parser.add_argument("--margin", type=float, default=120.0)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="training steps per block")
    parser.add_argument("--batch", type=int, default=64, help="one of two ranks' share of 128")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as `tandem run` gives each process
    torch.manual_seed(0)
    data = MNIST1D(train=True)
    x = torch.as_tensor(data.x, dtype=torch.float32).reshape(-1, 1, 40)
    y = torch.as_tensor(data.y).long()
    model = make_model()
    opt = make_muon(model.parameters())
    for _ in range(args.fit_steps):
        idx = torch.randint(0, len(x), (128,))
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    fitted = margins(model, x[:1000], y[:1000])
    late = copy.deepcopy(model)
    head = [m for m in late.modules() if isinstance(m, nn.Linear)][-1]
    scale = args.margin / float(fitted.median())
    with torch.no_grad():
        head.weight.mul_(scale)
        head.bias.mul_(scale)
    late_margins = margins(late, x[:1000], y[:1000])
    print(f"denormal: mnist1d model fitted {args.fit_steps} steps (median margin "
          f"{float(fitted.median()):.1f}); late state: classifier x{scale:.1f}, median margin "
          f"{float(late_margins.median()):.0f}, {float((late_margins > 87).float().mean()):.0%} "
          f"of samples past 87")
    for label, state in (("late state (subnormals)", late), ("control (fitted, none)", model)):
        plain, ours = [], []
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            for tandem in order:
                (ours if tandem else plain).append(
                    block_ms(state, x, y, args.steps, args.batch, tandem))
        ratios = [p / t for p, t in zip(plain, ours, strict=True)]
        print(f"  {label}: step plain torch median {statistics.median(plain):.1f} ms, "
              f"tandem {statistics.median(ours):.1f} ms; plain/tandem "
              f"{statistics.median(ratios):.2f}x (pairs {min(ratios):.2f}-{max(ratios):.2f}x, "
              f"{args.pairs} pairs of {args.steps}-step blocks, order alternating)")


if __name__ == "__main__":
    main()
