"""How far a job's batch can grow: its gradient noise scale read as a finding.

McCandlish et al. (2018), "An Empirical Model of Large-Batch Training": with B_noise the
gradient noise scale (`grad_noise_scale`, measured by the monitor), the optimizer steps
to a given loss go as S(B) = S_min (1 + B_noise / B). Doubling the batch B (twice the
processes at the same per-process batch) therefore takes the steps down by the factor
(1 + B_noise / 2B) / (1 + B_noise / B): close to 2x while B << B_noise, close to 1x (more
devices buy throughput, not time) once B >> B_noise.
"""

from __future__ import annotations

from tandem.analyze import text
from tandem.analyze.diagnosis.finding import Context, Finding
from tandem.analyze.report.figures import steady_median
from tandem.monitor.catalogue import GRAD_NOISE_SCALE

NOISE_METRIC = GRAD_NOISE_SCALE


def steps_ratio(batch: float, noise_scale: float, factor: float = 2.0) -> float:
    """Steps at `factor` x `batch` over steps at `batch` to the same loss (<= 1)."""
    return (1 + noise_scale / (factor * batch)) / (1 + noise_scale / batch)


def batch_scaling(ctx: Context) -> Finding | None:
    """The noise scale against the global batch, when the run measured it."""
    noise = steady_median(ctx.groups, NOISE_METRIC)
    batch = ctx.cfg("train.global_batch")
    if noise is None or noise <= 0 or not isinstance(batch, int | float) or batch <= 0:
        return None
    ratio = steps_ratio(float(batch), noise)
    where = ("below it: a larger batch still saves steps nearly in proportion"
             if batch < noise / 2 else
             "past it: a larger batch saves few steps; more processes buy throughput, "
             "not time to a loss" if batch > 2 * noise else
             "near it: a larger batch saves steps, but less than in proportion")
    message = (f"gradient noise scale ~{text.number(noise)} samples against a global batch of "
               f"{batch:g} ({where}); doubling the batch would take "
               f"{1 - ratio:.0%} of the steps off, not 50% (McCandlish et al. 2018)")
    return Finding("batch-scaling", "info",
                   {"noise_scale": noise, "global_batch": batch,
                    "steps_ratio_at_2x": ratio}, message, [])
