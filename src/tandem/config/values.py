"""Parsers of the config's small text values: train.target, train.batch_ramp, train.seq_ramp,
data.mix."""

from __future__ import annotations


def parse_ramp(text: str, global_batch: int) -> list[tuple[int, int]]:
    """Parse train.batch_ramp 'STEP:BATCH,...' into [(step, batch), ...], checked."""
    pairs: list[tuple[int, int]] = []
    for part in text.split(","):
        step, colon, batch = part.strip().partition(":")
        try:
            pairs.append((int(step), int(batch)))
        except ValueError:
            raise ValueError(f"train.batch_ramp: {part.strip()!r} is not STEP:BATCH "
                             "(e.g. '0:32,100:64,200:128')") from None
        if not colon:
            raise ValueError(f"train.batch_ramp: {part.strip()!r} is not STEP:BATCH")
    if pairs[0][0] != 0:
        raise ValueError(f"train.batch_ramp: the first entry must be at step 0, not {pairs[0][0]}")
    for (s0, b0), (s1, b1) in zip(pairs, pairs[1:], strict=False):
        if s1 <= s0 or b1 < b0:
            raise ValueError(f"train.batch_ramp: {s0}:{b0} then {s1}:{b1}; steps must rise and "
                             "batches must not shrink")
    if any(b < 1 for _, b in pairs):
        raise ValueError("train.batch_ramp: every batch must be >= 1")
    if pairs[-1][1] != global_batch:
        raise ValueError(f"train.batch_ramp: the last batch ({pairs[-1][1]}) must equal "
                         f"train.global_batch ({global_batch})")
    return pairs


def parse_seq_ramp(text: str) -> list[tuple[int, int]]:
    """Parse train.seq_ramp 'STEP:LEN,...' into [(step, length), ...] (0: full), checked."""
    example = "e.g. '0:32,50:64,100:0'"
    pairs: list[tuple[int, int]] = []
    for part in text.split(","):
        step, colon, length = part.strip().partition(":")
        try:
            pairs.append((int(step), int(length)))
        except ValueError:
            raise ValueError(f"train.seq_ramp: {part.strip()!r} is not STEP:LEN ({example})"
                             ) from None
        if not colon:
            raise ValueError(f"train.seq_ramp: {part.strip()!r} is not STEP:LEN ({example})")
    if pairs[0][0] != 0:
        raise ValueError(f"train.seq_ramp: the first entry must be at step 0, not {pairs[0][0]}")
    if pairs[-1][1] != 0:
        raise ValueError(f"train.seq_ramp: the last LEN must be 0 (the full length), not "
                         f"{pairs[-1][1]} ({example})")
    for (s0, n0), (s1, n1) in zip(pairs, pairs[1:], strict=False):
        if s1 <= s0 or n0 < 1 or (n1 and n1 < n0):
            raise ValueError(f"train.seq_ramp: {s0}:{n0} then {s1}:{n1}; steps must rise, "
                             f"lengths must be >= 1 and not shrink, 0 only last ({example})")
    return pairs


def parse_mix(text: str) -> tuple[dict[str, float] | None, float | None]:
    """Parse data.mix into (weights by source name, None) or (None, temperature)."""
    example = "e.g. 'digit=1,parity=3' or 'temperature=2'"
    pairs: dict[str, float] = {}
    for part in text.split(","):
        name, equals, value = (x.strip() for x in part.partition("="))
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not equals or not name or not 0 < number < float("inf"):
            raise ValueError(f"data.mix: {part.strip()!r} is not NAME=NUMBER with a finite "
                             f"number > 0 ({example})")
        if name in pairs:
            raise ValueError(f"data.mix: {name!r} is given twice ({example})")
        pairs[name] = number
    if list(pairs) == ["temperature"]:
        return None, pairs["temperature"]
    return pairs, None


TARGET_SLACK = 1e-6  # relative tolerance of train.target comparisons (float32 metrics)


def target_met(target: tuple[str, str, float], values: dict[str, float]) -> float | None:
    """The target metric's value if `values` meet `target` (from `parse_target`), else None.

    Metrics are float32 means: 470/500 correct comes out as 0.93999999, which must still
    count for 'accuracy>=0.94'; a relative slack of 1e-6 absorbs that. Raise ValueError
    when `values` lack the metric.
    """
    metric, op, goal = target
    value = values.get(metric)
    if value is None:
        raise ValueError(f"train.target names {metric!r}, which evaluation does not produce; "
                         f"it produces {sorted(values)}")
    slack = TARGET_SLACK * max(1.0, abs(goal))
    met = (value >= goal - slack) if op == ">=" else (value <= goal + slack)
    return value if met else None


def parse_target(text: str) -> tuple[str, str, float]:
    """Parse 'metric>=value' or 'metric<=value' into (metric, op, value)."""
    for op in (">=", "<="):
        if op in text:
            metric, _, value = text.partition(op)
            try:
                return metric.strip(), op, float(value)
            except ValueError:
                break
    raise ValueError(
        f"train.target: {text!r} is not a goal; write 'metric>=value' or 'metric<=value', "
        "e.g. 'accuracy>=0.97' or 'loss<=1.2'"
    )
