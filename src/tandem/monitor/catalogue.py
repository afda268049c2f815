"""The metric catalogue: every metric name a run writes to the store, with its unit and
meaning.

A metric's name is a contract between the writers (the monitor, strategies, the
trainer) and the readers (analysis, the tuner, the dashboard, the report): every one
imports the constant from here, so a renamed or misspelt metric fails at import, not
as an empty chart. The dashboard's scripts receive the same table (`as_json`), served
by the dashboard. Names are stored strings: changing one breaks existing run stores.

Besides the names listed, a run writes the task's own evaluation metrics under their
own names (`Task.metrics`: plain names without a `/`, which keeps them apart from the
measured figures here), and a mixture's figures of each source as task/<source>/<what>
(`task_metric`; the templates task/*/<what> are listed).
"""

from __future__ import annotations

from typing import Any, NamedTuple


class MetricInfo(NamedTuple):
    """One metric: its stored name, its unit and what it means."""

    name: str
    unit: str
    meaning: str


CATALOGUE: dict[str, MetricInfo] = {}


def _metric(name: str, unit: str, meaning: str) -> str:
    """Register a metric and return its name (the constant every module uses)."""
    assert name not in CATALOGUE, name
    CATALOGUE[name] = MetricInfo(name, unit, meaning)
    return name


# ---------------------------------------------------------------- training curves
LOSS = _metric("loss", "", "training loss, mean over the window's steps and all ranks")
SAMPLES_PER_S = _metric("samples_per_s", "samples/s",
                        "training throughput: the window's samples over its busy time")
TOKENS_PER_S = _metric("tokens_per_s", "tokens/s",
                       "samples_per_s times the task's tokens per sample")
GRAD_NORM = _metric("grad_norm", "", "global gradient norm before clipping, window mean")
LR = _metric("lr", "", "learning rate of the first parameter group at the window's end")
LOSS_SCALE = _metric("loss_scale", "", "fp16 gradient scaler's loss scale")
UPDATE_RATIO = _metric("update_ratio", "",
                       "norm of one optimizer update over the weights' norm")
MFU = _metric("mfu", "fraction", "model FLOPs utilisation: achieved FLOP/s over the peak")
GRAD_NOISE_SCALE = _metric("grad_noise_scale", "samples",
                           "gradient noise scale (critical batch estimate)")
EVAL_LOSS = _metric("eval_loss", "", "loss on the evaluation data")

# ---------------------------------------------------------------- tasks of a mixture
# A tandem.Mixture's sources: task/<source>/<what>, what one of these or the source's own
# evaluation metrics (Source.metrics, named without '/').
TASK_PREFIX = "task/"
TASK_LOSS = _metric("task/*/loss", "", "one source's training loss: mean over its samples "
                    "in the window's steps, all ranks")
TASK_EVAL_LOSS = _metric("task/*/eval_loss", "", "one source's loss on its evaluation data")
TASK_SHARE = _metric("task/*/share", "fraction",
                     "one source's share of the window's training samples")

# ---------------------------------------------------------------- step time and phases
TIME_PREFIX = "time/"
TIME_STEP = _metric("time/step", "s", "seconds per optimizer step (job: slowest rank; "
                    "rank rows: that rank's own)")
TIME_STEP_P50 = _metric("time/step_p50", "s", "median step time within the window")
TIME_STEP_MAX = _metric("time/step_max", "s", "longest step time within the window")
TIME_DATA = _metric("time/data", "s", "per step: waiting for the next batch")
TIME_H2D = _metric("time/h2d", "s", "per step: host-to-device copy on the critical path")
TIME_FORWARD = _metric("time/forward", "s", "per step: forward passes")
TIME_TEACHER = _metric("time/teacher", "s", "per step: a distillation teacher's forward "
                      "passes (a part of time/forward)")
TIME_BACKWARD = _metric("time/backward", "s", "per step: backward passes, all-reduce "
                        "waits included")
TIME_BACKWARD_SYNC = _metric("time/backward_sync", "s",
                             "per step: backward with its gradient synchronisation "
                             "(observed scripts)")
TIME_COMM = _metric("time/comm", "s", "per step: communication on the critical path "
                    "outside backward")
TIME_COMM_TAIL = _metric("time/comm_tail", "s", "per step: backward after the last "
                         "gradient was ready, waiting for the all-reduce")
TIME_OPTIM = _metric("time/optim", "s", "per step: optimizer step")
TIME_COMPUTE = _metric("time/compute", "s", "per step: forward + backward, less the "
                       "all-reduce wait")
TIME_COMM_EXPOSED = _metric("time/comm_exposed", "s",
                            "per step: communication the backward could not hide (wire)")
TIME_SYNC_WAIT = _metric("time/sync_wait", "s",
                         "per step: waiting for slower ranks (arrival skew)")
TIME_WIRE_PREDICTED = _metric("time/wire_predicted", "s",
                              "per step: wire time predicted from bytes and measured link")
TIME_COMM_BEYOND_WIRE = _metric("time/comm_beyond_wire", "s",
                                "exposed communication beyond the predicted wire time")
TIME_CHECKPOINT_BLOCKING = _metric("time/checkpoint_blocking_s", "s",
                                   "seconds training was blocked by one checkpoint save")
TIME_CALIBRATION = _metric("time/calibration_s", "s",
                           "seconds spent calibrating the link and the FLOP peak")

# ---------------------------------------------------------------- ranks
STRAGGLER_SCORE = _metric("straggler/score", "ratio",
                          "a rank's own step time over the median rank's (1 = typical)")

# ---------------------------------------------------------------- memory
MEM_PREFIX = "mem/"
MEM_RSS = _metric("mem/rss_bytes", "bytes", "host resident memory of the process")
MEM_PARAM = _metric("mem/param_bytes", "bytes", "bytes of the model's parameters (local)")
MEM_GRAD = _metric("mem/grad_bytes", "bytes", "bytes of the trainable parameters' gradients")
MEM_OPTIM = _metric("mem/optim_bytes", "bytes", "bytes of the optimizer's state")
MEM_CUDA_ALLOCATED = _metric("mem/cuda_allocated_bytes", "bytes",
                             "CUDA memory allocated by tensors now")
MEM_CUDA_RESERVED = _metric("mem/cuda_reserved_bytes", "bytes",
                            "CUDA memory held by the caching allocator")
MEM_CUDA_PEAK = _metric("mem/cuda_peak_bytes", "bytes",
                        "peak CUDA memory allocated since the last window")
MEM_CUDA_TOTAL = _metric("mem/cuda_total_bytes", "bytes", "the device's total memory")

# ---------------------------------------------------------------- system
SYS_PREFIX = "sys/"
SYS_CPU = _metric("sys/cpu_percent", "%", "host CPU utilisation (all cores)")
SYS_PROCESS_CPU = _metric("sys/process_cpu_percent", "%",
                          "this process's CPU utilisation (100 = one core)")
SYS_NET = _metric("sys/net_bytes_per_s", "bytes/s", "host network traffic, both ways")
SYS_DISK = _metric("sys/disk_bytes_per_s", "bytes/s", "host disk traffic, reads + writes")
SYS_GPU_UTIL = _metric("sys/gpu_util_percent", "%", "GPU utilisation (NVML)")
SYS_GPU_MEM_UTIL = _metric("sys/gpu_mem_util_percent", "%",
                           "GPU memory-controller utilisation (NVML)")

# ---------------------------------------------------------------- pipeline stages
# Recorded per rank; the job's value is the mean over the ranks.
PP_FORWARD_S = _metric("pp/forward_s", "s", "per step: the rank's stage forward actions")
PP_BACKWARD_S = _metric("pp/backward_s", "s",
                        "per step: the rank's stage backward actions (input and weight)")
PP_BUBBLE = _metric("pp/bubble", "fraction",
                    "share of the schedule's step (first start to the drain's end, over "
                    "the stages) the rank's stages were idle (measured)")
PP_BUBBLE_PREDICTED = _metric("pp/bubble_predicted", "fraction",
                              "the rank's idle share the schedule's action table predicts "
                              "from every stage's measured forward/backward costs")

# ---------------------------------------------------------------- communication
COMM_BYTES_PER_STEP = _metric("comm/bytes_per_step", "bytes",
                              "bytes each rank sends per step (ring-counted)")
COMM_BUCKETS_PER_STEP = _metric("comm/buckets_per_step", "",
                                "collectives launched per step")
COMM_BYTES_PER_SYNC = _metric("comm/bytes_per_sync", "bytes",
                              "local SGD / DiLoCo: bytes each rank sends per meeting (streaming "
                              "DiLoCo: per fragment's meeting), window mean")
COMM_PEAK_BYTES_PER_SYNC = _metric("comm/peak_bytes_per_sync", "bytes",
                                   "local SGD / DiLoCo: bytes of the window's largest meeting")
COMM_OVERLAP = _metric("comm/overlap", "fraction",
                       "streaming DiLoCo: share of the outer sums' time spent behind inner "
                       "steps (the rest was waited for at the merge)")
COMM_MERGE_WAIT = _metric("comm/merge_wait_s", "s",
                          "streaming DiLoCo: per step, waiting at merges for outer sums")
COMM_PULL_WAIT = _metric("comm/pull_wait_s", "s",
                         "async: per local step, this worker's wait to pull the outer model")
ASYNC_LOCAL_STEPS = _metric("async/local_steps", "count",
                            "async: local steps this worker took in the window")
ASYNC_PUSHES = _metric("async/pushes", "count", "async: updates this worker pushed")
ASYNC_EARLY_PUSHES = _metric("async/early_pushes", "count",
                             "async: pushes made before sync_every steps because faster "
                             "workers needed this worker's place within the staleness bound")
ASYNC_STALENESS_MEAN = _metric("async/staleness_mean", "steps",
                               "async: mean outer steps between this worker's pull and the "
                               "outer step its push joined (its pushes so far)")
ASYNC_STALENESS_MAX = _metric("async/staleness_max", "steps",
                              "async: the most stale of this worker's pushes so far "
                              "(<= plan.staleness)")
ASYNC_FRESH = _metric("async/fresh_share", "fraction",
                      "async: share of this worker's pushes so far that joined the outer step "
                      "after the one they started from (staleness 0)")
COMM_LATENCY = _metric("comm/latency_s", "s", "measured latency of a small all-reduce")
COMM_ALLREDUCE_RATE = _metric("comm/allreduce_bytes_per_s", "bytes/s",
                              "measured all-reduce buffer bytes per second (median)")
COMM_ALLREDUCE_RATE_LOW = _metric("comm/allreduce_bytes_per_s_low", "bytes/s",
                                  "slowest of the measured all-reduce rates")
COMM_ALLREDUCE_RATE_HIGH = _metric("comm/allreduce_bytes_per_s_high", "bytes/s",
                                   "fastest of the measured all-reduce rates")

# ---------------------------------------------------------------- FLOPs and noise
FLOPS_PER_RANK_STEP = _metric("flops/per_rank_step", "FLOP",
                              "model FLOPs of one optimizer step on one rank")
FLOPS_PEAK = _metric("flops/peak", "FLOP/s", "the device's peak FLOP/s used for MFU")
FLOPS_PEAK_MEASURED = _metric("flops/peak_measured", "bool",
                              "1 when the peak was measured here, 0 when from a table")
FLOPS_ACHIEVED = _metric("flops/achieved_per_s", "FLOP/s", "model FLOP/s achieved")
GNS_SMALL_GRAD_SQ = _metric("gns/small_grad_sq", "",
                            "squared gradient norm of one rank's micro-batch")
GNS_BIG_GRAD_SQ = _metric("gns/big_grad_sq", "",
                          "squared gradient norm of the global batch")

# ---------------------------------------------------------------- groups readers use
# Whole-run curves of training, as opposed to evaluation or the task's own metrics.
TRAINING_CURVES = (LOSS, SAMPLES_PER_S, TOKENS_PER_S, GRAD_NORM, LR, LOSS_SCALE,
                   UPDATE_RATIO, MFU)
STEP_TIMES = (TIME_STEP, TIME_STEP_P50, TIME_STEP_MAX)
# Under time/ but not a part of each step: each is a chart of its own, not a phase.
NOT_PHASES = (TIME_CHECKPOINT_BLOCKING, TIME_CALIBRATION, TIME_WIRE_PREDICTED)
# Per-rank heat maps the dashboard draws (a pipeline's stages: their idle share, measured
# and as the schedule predicts it).
HEATMAPS = (TIME_STEP, STRAGGLER_SCORE, PP_BUBBLE, PP_BUBBLE_PREDICTED)


def phase_metric(phase: str) -> str:
    """The stored name of a step phase (`monitor.phases.PHASES`): time/<phase>."""
    name = TIME_PREFIX + phase
    assert name in CATALOGUE, name
    return name


def task_metric(source: str, what: str) -> str:
    """The stored name of a mixture source's figure: task/<source>/<what>, `what` the
    part after task/*/ of TASK_LOSS, TASK_EVAL_LOSS, TASK_SHARE, or a metric of the
    source's own."""
    return f"{TASK_PREFIX}{source}/{what}"


def task_kind(template: str) -> str:
    """The <what> of a task/*/<what> template (TASK_LOSS -> 'loss')."""
    return template.removeprefix(TASK_PREFIX + "*/")


def split_task_metric(name: str) -> tuple[str, str] | None:
    """(source, what) of a task/<source>/<what> name; None for any other name."""
    if not name.startswith(TASK_PREFIX):
        return None
    source, _, what = name.removeprefix(TASK_PREFIX).partition("/")
    return (source, what) if source and what and source != "*" else None


def as_dict() -> dict[str, Any]:
    """The catalogue for the dashboard's scripts (JSON-ready): the constants by their
    Python name, each metric's entry by its stored name, and the groups."""
    names = {k: v for k, v in globals().items()
             if k.isupper() and isinstance(v, str) and (v in CATALOGUE or k.endswith("PREFIX"))}
    return {
        "names": names,
        "metrics": {n: m._asdict() for n, m in CATALOGUE.items()},
        "groups": {"TRAINING_CURVES": TRAINING_CURVES, "STEP_TIMES": STEP_TIMES,
                   "NOT_PHASES": NOT_PHASES, "HEATMAPS": HEATMAPS},
    }
