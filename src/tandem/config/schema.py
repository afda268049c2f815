"""The configuration's sections: one dataclass per section, each field with its default and
its documentation (`tandem.config` reads TOML files and command-line overrides into them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from tandem.parallel import registry as strategies


def _doc(default: Any, doc: str) -> Any:
    return field(default=default, metadata={"doc": doc})


@dataclass(kw_only=True)
class RunConfig:
    """Where the run lives and how it starts."""

    name: str = _doc("", "run name; the directory is <dir>/<name> (default: the script's name)")
    dir: str = _doc("runs", "parent directory of run directories")
    seed: int = _doc(0, "seed of the sample order and of every RNG (per rank, per step)")
    resume: Literal["auto", "never", "require", "fresh"] = _doc(
        "auto", "auto: continue from the latest good checkpoint if any (and stop, saying "
        "why, if checkpoints exist but none verifies); never: refuse a run directory that "
        "holds checkpoints; require: fail if there is none; fresh: start at step 0, moving "
        "any checkpoints there aside (renamed, never deleted)"
    )
    kind: Literal["user", "trial", "control"] = _doc(
        "user", "who made the run: user; trial or control for the tuner's own runs "
        "(`tandem runs` lists user runs unless --kind says otherwise)")
    allow_changes: str = _doc(
        "", "settings a resumed run may change although they change the training math: "
        "comma-separated keys (train.global_batch, optim.schedule, train.steps under a "
        "stretched schedule, optimizer, ...) or 'all'"
    )
    init_from: str = _doc(
        "", "start a fresh run from these weights: a tandem run directory or checkpoint "
        "directory (any world size or layout), a DCP directory, a .safetensors file or a "
        "folder of them (a sharded index included); Task.map_weights renames their keys; a "
        "resumed run continues from its own checkpoint")
    init_partial: bool = _doc(
        False, "run.init_from: load the keys that match the model by name and shape and "
        "keep the others as initialised (a new head), reporting them; off: any missing, "
        "unexpected or mismatched key is an error")


@dataclass(kw_only=True)
class TrainConfig:
    """The training math: same at every process count."""

    steps: int = _doc(1000, "optimizer steps to train")
    global_batch: int = _doc(128, "samples per optimizer step, summed over all processes")
    micro_batch: int = _doc(
        0, "samples per forward/backward on one process (0: global_batch / world size)"
    )
    grad_clip: float = _doc(0.0, "clip the global gradient norm to this value (0: off)")
    eval_every: int = _doc(0, "evaluate every N steps (0: only at the end)")
    eval_batch: int = _doc(256, "samples per evaluation batch on one process")
    batch_ramp: str = _doc(
        "", "grow the global batch on a schedule by raising accumulation: 'STEP:BATCH,...', "
        "the first at step 0 and the last BATCH equal to global_batch, e.g. "
        "'0:32,100:64,200:128'; each BATCH is a multiple of micro_batch x processes; the lr "
        "follows optim.lr_scaling for each step's batch (empty: off)"
    )
    target: str = _doc(
        "", "time-to-target goal, 'metric>=value' or 'metric<=value', e.g. 'accuracy>=0.97'"
    )
    stop_at_target: bool = _doc(
        False, "end the run at the first evaluation that meets train.target (with a "
        "checkpoint there when checkpoint.at_end)"
    )
    eval_from: int = _doc(
        0, "the eval_every schedule starts at this step: earlier multiples of eval_every are "
        "skipped (the last step always evaluates)"
    )
    ema_decay: float = _doc(
        0.0, "evaluate, checkpoint (state 'ema') and return an exponential moving average of "
        "the weights, updated after each step with decay min(ema_decay, (1 + t) / (10 + t)) "
        "at update t (0: off)"
    )
    eval_views: bool = _doc(
        True, "average the model's outputs over the views Task.eval_views makes of each "
        "evaluation batch (test-time augmentation), when the task gives it"
    )
    label_smoothing: float = _doc(
        0.0, "label smoothing of the training loss when Task.loss is tandem.CrossEntropy() "
        "(evaluation reports the plain loss; 0: off)"
    )
    freeze: str = _doc(
        "", "parameters that take no gradient: comma-separated glob patterns over the "
        "model's parameter names, e.g. '0.*,1.*' (out of DDP buckets and the optimizer; "
        "empty: train all)")
    lora_rank: int = _doc(
        0, "LoRA adapters of this rank on the model's Linear layers; every other "
        "parameter frozen (0: off; one process, DDP or low-communication plans)")
    lora_alpha: float = _doc(16.0, "LoRA scaling numerator: updates are scaled by "
                                   "lora_alpha / lora_rank")
    lora_targets: str = _doc(
        "", "the Linear layers that get adapters: comma-separated glob patterns over module "
        "names, e.g. '*.q,*.v' (empty: every nn.Linear)")
    distill_from: str = _doc(
        "", "knowledge distillation from a frozen teacher: its weights, a tandem run "
        "directory, a checkpoint directory or .safetensors (the teacher is built by "
        "Task.teacher, else Task.model); empty: Task.teacher's module as built, if given")
    distill_temperature: float = _doc(
        1.0, "distillation temperature T: teacher and student logits are softened by 1/T; "
        "the soft term is scaled by T^2 (a number > 0)")
    distill_ratio: float = _doc(
        0.5, "the distillation term's weight: ratio * T^2 * KL(teacher || student) + "
        "(1 - ratio) * Task.loss, in [0, 1] (0: no teacher is used)")
    distill_cache_mb: float = _doc(
        0.0, "keep the teacher's outputs per training sample, keyed by its input bytes, up "
        "to this many MB: a sample seen again skips the teacher (0: off)")
    seq_ramp: str = _doc(
        "", "grow the training sequence length: 'STEP:LEN,...' cuts dim 1 of every batch "
        "tensor with 2+ dims to LEN from STEP on, LEN 0 being the full length, the first at "
        "step 0 and the last LEN 0, e.g. '0:32,50:64,100:0' (empty: off)"
    )


@dataclass(kw_only=True)
class DataConfig:
    """The input pipeline."""

    workers: int = _doc(0, "DataLoader worker processes per rank (not used by plan.strategy "
                        "async, which loads each share when a worker claims it)")
    pin_memory: bool = _doc(True, "pin host memory of batches when training on CUDA")
    prefetch: int = _doc(2, "batches each DataLoader worker loads ahead")
    in_memory: bool = _doc(
        False, "read each dataset once at start into stacked tensors and gather every batch "
        "by indexing them (no DataLoader, no per-sample calls): the same samples in the same "
        "order; randomness a dataset draws per sample is drawn once"
    )
    mix: str = _doc(
        "", "a tandem.Mixture's shares instead of the script's: 'NAME=WEIGHT,...' for every "
        "source (e.g. 'digit=1,parity=3'), or 'temperature=T' (size^(1/T)); empty: the "
        "script's own"
    )


@dataclass(kw_only=True)
class PlanConfig:
    """How the model is spread over processes."""

    # The allowed values and their help come from the strategies' registry.
    strategy: Literal[strategies.CHOICES] = _doc(strategies.AUTO.name, strategies.help_text())
    sync_every: int = _doc(8, "localsgd/diloco: optimizer steps between meetings (H)")
    outer_lr: float = _doc(0.7, "diloco: learning rate of the outer Nesterov step")
    outer_momentum: float = _doc(
        0.9, "diloco: momentum of the outer Nesterov step (async: stale pushes add momentum "
        "of their own; 0.5 kept the demo's accuracy where 0.9 lost it)")
    fragments: int = _doc(
        4, "streaming_diloco: contiguous parts of the model (P), balanced by size, each "
        "meeting every sync_every steps at its own staggered step"
    )
    overlap_steps: int = _doc(
        1, "streaming_diloco: inner steps a part's outer sum runs in the background before "
        "it is merged (tau, < sync_every; 0: blocking, as diloco)"
    )
    merge_alpha: float = _doc(
        0.5, "streaming_diloco, overlap_steps > 0: a merged part keeps this share of its "
        "replica's values (the progress of the overlapped steps), the rest the outer values "
        "(0: replace)"
    )
    outer_dtype: Literal["fp32", "fp16", "bf16", "int8"] = _doc(
        "fp32", "streaming_diloco: format of the outer gradients on the wire (int8: one scale "
        "per tensor, all-gathered and summed after dequantising)"
    )
    staleness: int = _doc(
        2, "async: the most outer steps applied between a worker's pull of the model and "
        "the outer step its update joins (s; 0: synchronous, as diloco)"
    )
    bucket_mb: float = _doc(25.0, "DDP gradient bucket size in MiB")
    static_graph: bool = _doc(False, "DDP static_graph (the same parameters are used every step)")
    find_unused: bool = _doc(False, "DDP find_unused_parameters (some parameters get no gradient)")
    backend: Literal["auto", "gloo", "nccl"] = _doc(
        "auto", "process-group backend (auto: nccl on CUDA, gloo on CPU)"
    )
    device: Literal["auto", "cpu", "cuda"] = _doc("auto", "device (auto: cuda when available)")
    timeout_s: float = _doc(300.0, "collective timeout in seconds")
    threads: int = _doc(
        0, "CPU threads per process for torch's intra-op work (torch.set_num_threads); 0 "
        "leaves it to OMP_NUM_THREADS (`tandem run` sets 1 when unset)"
    )
    malloc_threshold_mb: float = _doc(
        16.0, "glibc hosts: allocations up to this size are reused from the heap instead of "
        "being mapped and unmapped (page-faulted) each step; 0 keeps glibc's adaptive "
        "threshold (at most 32; MALLOC_MMAP_THRESHOLD_ in the environment wins)"
    )
    flush_denormal: bool = _doc(
        True, "CPU: treat subnormal floats (below 1.2e-38) as zero in arithmetic, as "
        "TensorFlow does on CPU; computing on them is tens of times slower, and a model that "
        "has fitted its data makes them (its softmax gives the wrong classes less than "
        "1e-38). Set on each process's main thread while the run lasts; false keeps IEEE "
        "subnormals"
    )
    comm_hook: Literal["none", "fp16", "bf16", "powersgd", "topk", "hierarchical"] = _doc(
        "none", "DDP gradient communication: none (fp32 all-reduce); fp16 / bf16 (half the "
        "bytes; bf16 needs nccl); powersgd, topk (lossy, with error feedback); hierarchical "
        "(reduce in node, all-reduce between nodes, broadcast in node)"
    )
    host_allreduce: Literal["auto", "shared_memory", "backend"] = _doc(
        "auto", "DDP's gradient all-reduce between CPU processes of one host: shared_memory "
        "(each process writes its buckets into one shared segment and sums its peers'; no "
        "sockets); backend (the process group's, gloo); auto: shared_memory where every "
        "process can map one segment, comm_hook is none and the host is x86-64, else backend"
    )
    powersgd_rank: int = _doc(2, "comm_hook powersgd: rank of the low-rank approximation")
    powersgd_warmup: int = _doc(
        10, "comm_hook powersgd: steps of plain all-reduce before compressing (>= 2)"
    )
    topk_ratio: float = _doc(0.01, "comm_hook topk: fraction of each bucket's entries sent")
    fsdp_reshard: bool = _doc(
        True, "fsdp: free each block's gathered parameters after its forward (less memory, "
        "one more all-gather in backward)"
    )
    fsdp_param_dtype: Literal["fp32", "bf16", "fp16"] = _doc(
        "fp32", "fsdp: dtype the gathered parameters compute in (fp32: their own dtype)"
    )
    fsdp_reduce_dtype: Literal["fp32", "bf16", "fp16"] = _doc(
        "fp32", "fsdp: dtype of the gradient reduce-scatter"
    )
    pp: int = _doc(
        1, "pipeline stages: the model is cut into this many parts along its block list, "
        "one per process of a pipeline; the other processes are data-parallel replicas of "
        "the pipeline (1: off). The model's forward must skip its parts that are None"
    )
    pp_schedule: Literal["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS",
                         "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"] = _doc(
        "1F1B", "pipeline schedule (torch.distributed.pipelining); Interleaved1F1B, "
        "LoopedBFS and InterleavedZeroBubble take plan.pp_virtual stages per process, "
        "ZBVZeroBubble and DualPipeV exactly 2"
    )
    pp_microbatches: int = _doc(
        0, "pipeline micro-batches per step (each the per-process batch / this); 0: those "
        "train.micro_batch makes, or one per stage when it is 0"
    )
    pp_virtual: int = _doc(1, "pipeline stages per process (multi-stage schedules)")
    pp_split: str = _doc(
        "", "pipeline stages' units, stages separated by '|', units by ',' (e.g. "
        "'embed,pos,blocks.0|blocks.1,norm,head'); empty: the blocks spread evenly, the "
        "parts before them on the first stage, after them on the last"
    )
    pp_watchdog_s: float = _doc(
        60.0, "stop a pipeline step whose schedule makes no progress for this long, naming "
        "the schedule, stage and action (0: off)"
    )
    tp: int = _doc(
        1, "tensor-parallel degree: each data-parallel replica is split over this many "
        "processes along the layers the task's tensor_parallel plan names (1: off)"
    )
    activation_checkpointing: bool = _doc(
        False, "recompute each block's activations in backward instead of keeping them "
        "(less memory, about one more forward of compute)"
    )
    compile: bool = _doc(False, "torch.compile the model (skipped with a warning where it "
                                "cannot work)")
    init: Literal["eager", "deferred"] = _doc(
        "eager", "eager: build the whole model on every process, as the task's factory "
        "initialises it; deferred: build it on the meta device, spread it (fsdp, tp), then "
        "initialise only this process's part, each module by its reset_parameters() seeded "
        "by run.seed and its name (the same weights at any process count; for models larger "
        "than one process's memory)"
    )


@dataclass(kw_only=True)
class PrecisionConfig:
    """Numerics of forward and backward."""

    mode: Literal["fp32", "bf16", "fp16"] = _doc(
        "fp32", "fp32; bf16 autocast; fp16 autocast with dynamic loss scaling"
    )
    init_scale: float = _doc(65536.0, "fp16: initial loss scale")
    growth_interval: int = _doc(2000, "fp16: steps without overflow before the scale grows")
    attention: Literal["auto", "fp32", "autocast"] = _doc(
        "auto", "attention (F.scaled_dot_product_attention) under bf16/fp16 autocast: fp32 "
        "computes it in fp32 and returns the autocast dtype; autocast leaves it to autocast "
        "(the half dtype); auto: fp32 on CPU, whose half-precision attention kernels are "
        "slower than fp32's, autocast on GPUs"
    )


@dataclass(kw_only=True)
class OptimConfig:
    """Learning-rate schedule and scaling (the optimizer itself comes from the Task)."""

    schedule: Literal["constant", "warmup_cosine", "onecycle", "warmup_linear", "wsd"] = _doc(
        "constant", "multiplier of the optimizer's lr over the steps: warmup_cosine and "
        "warmup_linear fall from the peak after warmup_steps to min_lr_ratio at the end; wsd "
        "(warm-up, stable, decay) holds the peak and falls linearly over the last "
        "cooldown_frac of the steps"
    )
    warmup_steps: int = _doc(0, "linear warm-up steps (warmup_cosine)")
    min_lr_ratio: float = _doc(0.0, "final lr as a fraction of the peak (warmup_cosine, "
                                    "warmup_linear, wsd, onecycle)")
    cooldown_frac: float = _doc(0.2, "wsd: fraction of the steps, at the end, over which the "
                                     "lr falls linearly to min_lr_ratio")
    pct_start: float = _doc(0.3, "fraction of steps spent rising (onecycle)")
    lr_scaling: Literal["none", "linear", "sqrt"] = _doc(
        "none", "scale the lr with global_batch / reference_batch"
    )
    reference_batch: int = _doc(0, "batch size the optimizer's lr was tuned for (lr_scaling)")
    momentum_schedule: Literal["constant", "onecycle"] = _doc(
        "constant", "momentum (SGD momentum or Adam's beta1) over the steps: constant keeps "
        "the optimizer's; onecycle falls from momentum_max to momentum_min while the lr "
        "rises and climbs back while it falls (torch OneCycleLR's cycle_momentum)"
    )
    momentum_min: float = _doc(0.85, "momentum_schedule onecycle: the lowest momentum")
    momentum_max: float = _doc(0.95, "momentum_schedule onecycle: the highest momentum")


@dataclass(kw_only=True)
class CheckpointConfig:
    """When state is committed to disk."""

    every: int = _doc(0, "checkpoint every N steps (0: only at the end)")
    keep: int = _doc(2, "committed checkpoints to keep (0: all)")
    at_end: bool = _doc(True, "checkpoint after the last step")
    async_save: bool = _doc(
        True, "write checkpoints in the background: the step waits only while the state is "
        "copied to host memory (one save in flight at a time)"
    )


@dataclass(kw_only=True)
class FaultConfig:
    """What the run does when something goes wrong."""

    nonfinite: Literal["skip", "rollback", "raise"] = _doc(
        "skip", "on a NaN/Inf gradient (fp32/bf16; fp16 has its loss scaler): skip the step, "
        "roll back to the last good checkpoint, or stop"
    )
    spike: Literal["warn", "rollback"] = _doc(
        "warn", "on a loss spike: record it, or roll back to the checkpoint before it"
    )
    rollback_lr_scale: float = _doc(1.0, "multiply the lr by this after each rollback")
    max_rollbacks: int = _doc(3, "rollbacks allowed before the run stops")
    heartbeat_s: float = _doc(2.0, "seconds between each rank's liveness records (0: off)")


@dataclass(kw_only=True)
class MonitorConfig:
    """What the run shows and records."""

    log_every: int = _doc(10, "record loss and throughput every N steps")
    timing: bool = _doc(True, "time the phases of each step (data, compute, optimizer)")
    store: str = _doc("", "SQLite run store (default: <run.dir>/tandem.db)")
    calibrate_at: int = _doc(
        20, "this many steps into a run (past warm-up), and again into each resumed "
        "segment, measure FLOPs, the device's peak and the link's latency and bandwidth "
        "(0: never; the link again if the step time drifts)"
    )
    progress: Literal["auto", "bar", "log", "off"] = _doc(
        "auto", "rank 0 progress: a live bar (terminals), log lines, or nothing"
    )
    tensorboard: str = _doc(
        "", "TensorBoard log directory, relative to the run directory ('' = off)"
    )
    prometheus_port: int = _doc(
        -1, "serve live figures to Prometheus on this port (-1 = off, 0 = a free port)"
    )
    prometheus_host: str = _doc("127.0.0.1", "address the Prometheus endpoint binds")
    report: bool = _doc(True, "write <run dir>/report.html when the run completes")


@dataclass(kw_only=True)
class Config:
    """Every setting of a run."""

    run: RunConfig = field(default_factory=RunConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The config as plain nested dicts (for JSON and TOML)."""
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        """The config as a TOML document that `load` reads back."""
        lines: list[str] = []
        for section, values in self.to_dict().items():
            lines.append(f"[{section}]")
            lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
            lines.append("")
        return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
