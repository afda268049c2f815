"""Statistical efficiency of a larger batch, from the gradient noise scale.

McCandlish et al. (2018): with per-example gradient covariance Sigma and true gradient G,
the noise scale B_noise = tr(Sigma) / |G|^2 is the batch size beyond which a larger batch
stops buying proportionally fewer steps. Training at batch B instead of the base batch B0
makes each sample worth

    E(B) = (B_noise + B0) / (B_noise + B)          (E(B0) = 1)

of a sample at B0 (the form Pollux uses), so one step at B advances training by
B / B0 * E(B) steps at B0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class EfficiencyModel:
    """Statistical efficiency of global batch sizes relative to a base batch."""

    noise_scale: float
    """Gradient noise scale B_noise in samples (math.inf: every batch is as good)."""
    base_batch: int
    """The batch at which efficiency is 1 (the batch the user's recipe was tuned for)."""

    def __post_init__(self) -> None:
        if not self.noise_scale >= 0:
            raise ValueError(f"noise_scale: {self.noise_scale} is not allowed; need >= 0")
        if self.base_batch < 1:
            raise ValueError(f"base_batch: {self.base_batch} is not allowed; need >= 1")

    @classmethod
    def from_gradient_stats(cls, grad_sqr: float, grad_var: float,
                            base_batch: int) -> EfficiencyModel:
        """Build from |G|^2 and the variance of the gradient estimated at `base_batch`.

        The variance of a mean over B0 examples is tr(Sigma) / B0, so
        B_noise = B0 * grad_var / grad_sqr. A non-positive grad_sqr (no signal measured
        yet) means no batch size is worse than another: infinite noise scale.
        """
        if grad_var < 0:
            raise ValueError(f"grad_var: {grad_var} is negative; a variance is >= 0")
        if grad_sqr <= 0:
            return cls(noise_scale=math.inf, base_batch=base_batch)
        return cls(noise_scale=base_batch * grad_var / grad_sqr, base_batch=base_batch)

    def efficiency(self, batch: float) -> float:
        """Worth of one sample at `batch` in samples at the base batch."""
        if math.isinf(self.noise_scale):
            return 1.0
        return (self.noise_scale + self.base_batch) / (self.noise_scale + batch)

