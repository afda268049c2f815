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

LABELS: dict[str, str] = {
    # training curves
    "loss": "loss",
    "eval_loss": "evaluation loss",
    "accuracy": "accuracy",
    "samples_per_s": "throughput (samples/s)",
    "tokens_per_s": "throughput (tokens/s)",
    "grad_norm": "gradient norm",
    "grad_noise_scale": "gradient noise scale (samples)",
    "lr": "learning rate",
    "loss_scale": "loss scale (fp16)",
    "update_ratio": "update / weight ratio",
    "mfu": "MFU (share of peak FLOP/s)",
    # step-time phases and system figures
    "time/step": "step time (s)",
    "time/step_p50": "step time, median over ranks (s)",
    "time/step_max": "step time, slowest rank (s)",
    "time/data": "data wait (s)",
    "time/h2d": "host to device (s)",
    "time/forward": "forward (s)",
    "time/backward": "backward (s)",
    "time/backward_sync": "backward with gradient sync (s)",
    "time/compute": "forward + backward (s)",
    "time/comm": "communication (s)",
    "time/comm_exposed": "exposed communication, wire (s)",
    "time/comm_beyond_wire": "communication beyond the wire time (s)",
    "time/comm_wait": "waiting for communication (s)",
    "time/sync_wait": "waiting for other ranks (s)",
    "time/optim": "optimizer (s)",
    "time/optimizer": "optimizer (s)",
    "time/checkpoint_blocking_s": "checkpoint, blocking (s)",
    "time/calibration_s": "link calibration (s)",
    "time/wire_predicted": "predicted wire time (s)",
    "straggler/score": "straggler score (x median rank)",
    "comm/allreduce_bytes_per_s": "all-reduce bandwidth (bytes/s)",
    "comm/allreduce_bytes_per_s_low": "all-reduce bandwidth, 95% CI low (bytes/s)",
    "comm/allreduce_bytes_per_s_high": "all-reduce bandwidth, 95% CI high (bytes/s)",
    "comm/buckets_per_step": "gradient buckets per step",
    "comm/bytes_per_step": "bytes communicated per step",
    "comm/latency_s": "communication latency (s)",
    "mem/rss_bytes": "host memory, RSS (bytes)",
    "mem/param_bytes": "parameters (bytes)",
    "mem/grad_bytes": "gradients (bytes)",
    "mem/optim_bytes": "optimizer state (bytes)",
    "mem/cuda_allocated_bytes": "GPU memory allocated (bytes)",
    "mem/cuda_reserved_bytes": "GPU memory reserved (bytes)",
    "mem/cuda_peak_bytes": "GPU memory peak (bytes)",
    "mem/cuda_total_bytes": "GPU memory total (bytes)",
    "sys/cpu_percent": "CPU use, host (%)",
    "sys/process_cpu_percent": "CPU use, this process (%)",
    "sys/gpu_util_percent": "GPU use (%)",
    "sys/gpu_mem_util_percent": "GPU memory use (%)",
    "sys/disk_bytes_per_s": "disk traffic (bytes/s)",
    "sys/net_bytes_per_s": "network traffic (bytes/s)",
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
    name = name.rsplit("/", 1)[-1]  # a metric's family prefix (time/, mem/) says little
    for suffix, unit in SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            stem = name[: -len(suffix)].replace("_", " ")
            return f"{stem}{unit}" if unit.startswith("/") else f"{stem} ({unit})"
    return name.replace("_", " ")


def as_json() -> str:
    """The labels and unit endings for the page's scripts (embedded in every page)."""
    return json.dumps({"labels": LABELS, "suffixes": SUFFIXES}).replace("</", "<\\/")
