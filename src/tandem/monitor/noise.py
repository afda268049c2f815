"""The gradient noise scale: how far a larger batch still helps (McCandlish et al., 2018).

B_noise = tr(Sigma) / |G|^2, where G is the true gradient and Sigma the covariance of one
sample's gradient. With the squared norm of a small-batch gradient (one rank's own, of
B_small samples, before the all-reduce) and of the big-batch gradient (the all-reduced
one, of B_big samples), their Appendix A gives unbiased estimates of both parts:

    |G|^2     ~ (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|g_small|^2 - |g_big|^2) / (1 / B_small - 1 / B_big)

Each estimate from one step is noisy (the trace one can even come out negative), so both
are smoothed with an exponential moving average before their ratio is taken, as the
paper does. Training at a batch near B_noise is the efficient trade of steps for samples.
"""

from __future__ import annotations

import math

SMOOTHING = 0.2  # weight of the newest estimate in the moving averages


class NoiseScale:
    """Running estimate of B_noise from (small, big) batch gradient norms."""

    def __init__(self, smoothing: float = SMOOTHING) -> None:
        self.smoothing = smoothing
        self.grad_sq: float | None = None  # smoothed |G|^2
        self.trace: float | None = None  # smoothed tr(Sigma)

    def update(self, small_sq: float, big_sq: float, b_small: int, b_big: int) -> None:
        """Add one step's squared norms (mean over ranks of |g_small|^2, and |g_big|^2)."""
        if b_big <= b_small or not (math.isfinite(small_sq) and math.isfinite(big_sq)):
            return
        grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
        trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
        a = self.smoothing
        self.grad_sq = grad_sq if self.grad_sq is None else (1 - a) * self.grad_sq + a * grad_sq
        self.trace = trace if self.trace is None else (1 - a) * self.trace + a * trace

    def value(self) -> float | None:
        """The smoothed B_noise in samples (None until the averages make sense)."""
        if self.grad_sq is None or self.trace is None or self.grad_sq <= 0 or self.trace < 0:
            return None
        return self.trace / self.grad_sq
