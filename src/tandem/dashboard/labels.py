"""What the dashboard shows in place of a field or metric name: words, with the unit.

The pages draw whatever fields a finding, a tune session or a summary holds (a new
field shows up without a change to the scripts), so they used to show the names as
stored: `predicted_speedup`, `pair_sd`, `phase_s`. Every name the pages show goes
through `T.label` (static/common.js), which reads `LABELS` here and, for a name not in
it, `SUFFIXES` (the unit a name's ending stands for: `_s` seconds, `_bytes` bytes).
The stored name stays in the element's tooltip. Config and plan keys are shown as
written (they are what a flag or a plan file names), never relabelled.
"""

from __future__ import annotations

import json

from tandem.monitor.catalogue import (
    COMM_ALLREDUCE_RATE,
    COMM_ALLREDUCE_RATE_HIGH,
    COMM_ALLREDUCE_RATE_LOW,
    COMM_BUCKETS_PER_STEP,
    COMM_BYTES_PER_STEP,
    COMM_BYTES_PER_SYNC,
    COMM_LATENCY,
    COMM_MERGE_WAIT,
    COMM_OVERLAP,
    COMM_PEAK_BYTES_PER_SYNC,
    EVAL_LOSS,
    GRAD_NOISE_SCALE,
    GRAD_NORM,
    LOSS,
    LOSS_SCALE,
    LR,
    MEM_CUDA_ALLOCATED,
    MEM_CUDA_PEAK,
    MEM_CUDA_RESERVED,
    MEM_CUDA_TOTAL,
    MEM_GRAD,
    MEM_OPTIM,
    MEM_PARAM,
    MEM_RSS,
    MFU,
    PP_BACKWARD_S,
    PP_BUBBLE,
    PP_BUBBLE_PREDICTED,
    PP_FORWARD_S,
    SAMPLES_PER_S,
    STRAGGLER_SCORE,
    SYS_CPU,
    SYS_DISK,
    SYS_GPU_MEM_UTIL,
    SYS_GPU_UTIL,
    SYS_NET,
    SYS_PROCESS_CPU,
    TIME_BACKWARD,
    TIME_BACKWARD_SYNC,
    TIME_CALIBRATION,
    TIME_CHECKPOINT_BLOCKING,
    TIME_COMM,
    TIME_COMM_BEYOND_WIRE,
    TIME_COMM_EXPOSED,
    TIME_COMPUTE,
    TIME_DATA,
    TIME_FORWARD,
    TIME_H2D,
    TIME_OPTIM,
    TIME_STEP,
    TIME_STEP_MAX,
    TIME_STEP_P50,
    TIME_SYNC_WAIT,
    TIME_WIRE_PREDICTED,
    TOKENS_PER_S,
    UPDATE_RATIO,
    split_task_metric,
)

LABELS: dict[str, str] = {
    # training curves
    LOSS: "loss",
    EVAL_LOSS: "evaluation loss",
    "accuracy": "accuracy",
    SAMPLES_PER_S: "throughput (samples/s)",
    TOKENS_PER_S: "throughput (tokens/s)",
    GRAD_NORM: "gradient norm",
    GRAD_NOISE_SCALE: "gradient noise scale (samples)",
    LR: "learning rate",
    LOSS_SCALE: "loss scale (fp16)",
    UPDATE_RATIO: "update / weight ratio",
    MFU: "MFU (share of peak FLOP/s)",
    # step-time phases and system figures
    TIME_STEP: "step time (s)",
    TIME_STEP_P50: "step time, median over ranks (s)",
    TIME_STEP_MAX: "step time, slowest rank (s)",
    TIME_DATA: "data wait (s)",
    TIME_H2D: "host to device (s)",
    TIME_FORWARD: "forward (s)",
    TIME_BACKWARD: "backward (s)",
    TIME_BACKWARD_SYNC: "backward with gradient sync (s)",
    TIME_COMPUTE: "forward + backward (s)",
    TIME_COMM: "communication (s)",
    TIME_COMM_EXPOSED: "exposed communication, wire (s)",
    TIME_COMM_BEYOND_WIRE: "communication beyond the wire time (s)",
    TIME_SYNC_WAIT: "waiting for other ranks (s)",
    TIME_OPTIM: "optimizer (s)",
    TIME_CHECKPOINT_BLOCKING: "checkpoint, blocking (s)",
    TIME_CALIBRATION: "link calibration (s)",
    TIME_WIRE_PREDICTED: "predicted wire time (s)",
    STRAGGLER_SCORE: "straggler score (x median rank)",
    PP_FORWARD_S: "pipeline stage forward (s per step)",
    PP_BACKWARD_S: "pipeline stage backward (s per step)",
    PP_BUBBLE: "pipeline bubble, measured (idle share)",
    PP_BUBBLE_PREDICTED: "pipeline bubble, predicted (idle share)",
    COMM_ALLREDUCE_RATE: "all-reduce bandwidth (bytes/s)",
    COMM_ALLREDUCE_RATE_LOW: "all-reduce bandwidth, 95% CI low (bytes/s)",
    COMM_ALLREDUCE_RATE_HIGH: "all-reduce bandwidth, 95% CI high (bytes/s)",
    COMM_BUCKETS_PER_STEP: "gradient buckets per step",
    COMM_BYTES_PER_STEP: "bytes communicated per step",
    COMM_LATENCY: "communication latency (s)",
    COMM_BYTES_PER_SYNC: "bytes per meeting (or part's meeting)",
    COMM_PEAK_BYTES_PER_SYNC: "bytes of the largest meeting",
    COMM_OVERLAP: "outer sums hidden behind inner steps (share)",
    COMM_MERGE_WAIT: "waiting for outer sums at merges (s)",
    MEM_RSS: "host memory, RSS (bytes)",
    MEM_PARAM: "parameters (bytes)",
    MEM_GRAD: "gradients (bytes)",
    MEM_OPTIM: "optimizer state (bytes)",
    MEM_CUDA_ALLOCATED: "GPU memory allocated (bytes)",
    MEM_CUDA_RESERVED: "GPU memory reserved (bytes)",
    MEM_CUDA_PEAK: "GPU memory peak (bytes)",
    MEM_CUDA_TOTAL: "GPU memory total (bytes)",
    SYS_CPU: "CPU use, host (%)",
    SYS_PROCESS_CPU: "CPU use, this process (%)",
    SYS_GPU_UTIL: "GPU use (%)",
    SYS_GPU_MEM_UTIL: "GPU memory use (%)",
    SYS_DISK: "disk traffic (bytes/s)",
    SYS_NET: "network traffic (bytes/s)",
    # findings
    "evidence": "evidence",
    "suggestions": "what to try",
    "predicted_speedup": "predicted speed-up if removed (x)",
    "control": "control experiment",
    "validation": "validation",
    "share": "share of step time",
    "phase_s": "time in this phase per step (s)",
    "step_s": "step time (s)",
    "windows": "windows",
    "windows_over": "windows over the threshold",
    "median_score": "median straggler score (x)",
    "per_rank": "per rank",
    "ranks": "ranks",
    "rank": "rank",
    "noise_scale": "gradient noise scale (samples)",
    "global_batch": "global batch (samples)",
    "steps_ratio_at_2x": "steps needed at twice the batch (x)",
    "wire_predicted_s": "predicted wire time per step (s)",
    "beyond_wire_s": "communication beyond the wire time (s)",
    "hop_latency_s": "latency per hop (s)",
    "link_bytes_per_s": "link bandwidth (bytes/s)",
    "local_bytes_per_s": "local bandwidth (bytes/s)",
    "peak_bytes": "peak memory (bytes)",
    "total_bytes": "memory available (bytes)",
    "rss_peak_bytes": "host memory peak (bytes)",
    "cuda_peak_bytes": "GPU memory peak (bytes)",
    "wake_s": "wake-up time (s)",
    "step_wake_s": "wake-up time per step (s)",
    "spike_steps": "steps with a loss spike",
    "nonfinite_steps": "steps with NaN or inf",
    "loss_scale_drops": "loss-scale drops",
    "start_loss": "loss at the start",
    "max_loss": "highest loss",
    "start_grad_norm": "gradient norm at the start",
    "max_grad_norm": "highest gradient norm",
    "predicted_gain": "predicted gain",
    # tuner and its statistics
    "pair_sd": "spread between paired runs (sd of log ratio)",
    "df": "degrees of freedom",
    "placebo": "placebo (A/A) ratio",
    "placebo_pairs": "placebo pairs",
    "floor": "noise floor (x)",
    "figure": "figure compared",
    "estimate": "estimate",
    "low": "95% CI low",
    "high": "95% CI high",
    "n": "pairs",
    "ratio": "ratio to the plan (x)",
    "speedup": "speed-up (x)",
    "trials": "trials",
    "runs": "runs",
    "wall_s": "wall time (s)",
    "duration_s": "duration (s)",
    "wall_time_s": "wall time (s)",
    "measured_samples_per_s": "measured throughput (samples/s)",
    "objective_s": "objective (s)",
    "best_objective_s": "best objective (s)",
    "baseline_objective_s": "baseline objective (s)",
    "budget_s": "budget (s)",
    "cost_s": "cost (s)",
    "noise": "noise",
    "validations": "validations",
    # summaries
    "final_loss": "final loss",
    "world_size": "processes",
    "scaling_speedup": "scaling speed-up (x)",
    "scaling_efficiency": "scaling efficiency",
    "scaling_predicted": "scaling predicted (x)",
    "scaling_reference": "scaling reference run",
    "git_commit": "git commit",
}

# A name's ending and the unit it stands for, longest first (for a name not in LABELS).
SUFFIXES: tuple[tuple[str, str], ...] = (
    ("_bytes_per_s", "bytes/s"), ("_per_s", "/s"), ("_bytes", "bytes"), ("_gib", "GiB"),
    ("_mib", "MiB"), ("_mb", "MB"), ("_ms", "ms"), ("_s", "s"), ("_percent", "%"),
)


def label(name: str) -> str:
    """The words for `name` (what `T.label` in static/common.js does, for Python views)."""
    if name in LABELS:
        return LABELS[name]
    if "." in name or " " in name:  # a config key, as the user writes it; or words
        return name
    if (task := split_task_metric(name)) is not None:  # a mixture source's figure
        return f"{task[0]} {label(task[1])}"
    name = name.rsplit("/", 1)[-1]  # a metric's family prefix (time/, mem/) says little
    for suffix, unit in SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            stem = name[: -len(suffix)].replace("_", " ")
            return f"{stem}{unit}" if unit.startswith("/") else f"{stem} ({unit})"
    return name.replace("_", " ")


def as_json() -> str:
    """The labels and unit endings for the page's scripts (embedded in every page)."""
    return json.dumps({"labels": LABELS, "suffixes": SUFFIXES}).replace("</", "<\\/")
