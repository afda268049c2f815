"""Near misses: what a session tries when its diagnosis proposes nothing.

A well-configured job shows no smell and no finding the tuner acts on, so its session
would try nothing, and "adopted nothing" would then say nothing about the tuner's
judgement. Such a session tries instead the current plan's nearest neighbours on the
knobs the measurements can price, largest predicted gain first, even where that gain is
under 1 + min_gain (at most NEAR_MISSES of them):

* **one loader worker per rank** where the job loads in the training processes: it
  hides the measured data wait (step / (step - data wait));
* **DDP buckets BUCKET_GROWTH times larger** where the gradient spans several buckets:
  fewer all-reduces, each one calibrated latency saved;
* **an evaluation half as often** where the job evaluates: half its measured cost.

They are judged as any candidate (paired runs, the placebo's floor, the k-th candidate
spending 2^-k of the session's error rate), so trying them costs budget, never the
session's error rate: a near miss is adopted only where it is measured faster than
1 + min_gain outside the noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tandem.tune.measure import Measured
from tandem.tune.sizing import MAX_SAVED_SHARE, MIB, _wall_per_step
from tandem.tune.space import Candidate, _ddp

NEAR_MISSES = 2
BUCKET_GROWTH = 4.0
WHY = "a near miss (the diagnosis proposed nothing)"


def near_misses(m: Measured, base: Mapping[str, Any]) -> list[Candidate]:
    """The plan `base`'s priced neighbours, largest predicted gain first, NEAR_MISSES."""
    out: list[Candidate] = []
    step = m.step_s
    if not step or step <= 0:
        return out
    if m.data_s and int(base.get("data.workers") or 0) == 0:
        out.append(Candidate(
            {"data.workers": 1}, "data",
            f"{WHY}: a data wait of {m.data_s * 1e3:.3g} ms of a {step * 1e3:.3g} ms step "
            "read in the training processes; one loader worker per rank",
            predicted=step / max(step - m.data_s, 1e-9)))
    if (_ddp(base, m.world) and base.get("plan.comm_hook", "none") == "none"
            and m.buckets and m.buckets > 1 and m.latency_s):
        size = float(base.get("plan.bucket_mb") or 25.0)
        new = size * BUCKET_GROWTH
        fewer = m.buckets - max(1.0, math.ceil(m.buckets / BUCKET_GROWTH))
        if not m.grad_bytes or m.grad_bytes > size * MIB:
            saved = min(fewer * m.latency_s, MAX_SAVED_SHARE * step)
            out.append(Candidate(
                {"plan.bucket_mb": round(new, 3)}, "comm",
                f"{WHY}: {m.buckets:.0f} all-reduces a step of {m.latency_s * 1e3:.3g} ms "
                f"latency each; buckets of {new:g} MiB",
                predicted=step / max(step - saved, 1e-9)))
    every = int(base.get("train.eval_every") or 0)
    wall = _wall_per_step(m)
    if m.eval_s and every and wall:
        saved = m.eval_s / every / 2
        out.append(Candidate(
            {"train.eval_every": 2 * every}, "cadence",
            f"{WHY}: an evaluation costs {m.eval_s * 1e3:.3g} ms every {every} steps; "
            f"every {2 * every}", predicted=wall / max(wall - saved, 1e-9)))
    return sorted(out, key=lambda c: -(c.predicted or 0.0))[:NEAR_MISSES]
