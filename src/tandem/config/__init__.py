"""One configuration tree: TOML files and dotted command-line overrides read into the
sections of `tandem.config.schema`, checked, and the script's command line."""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tandem.config.schema import (  # noqa: F401 - the sections, re-exported
    CheckpointConfig,
    Config,
    DataConfig,
    FaultConfig,
    MonitorConfig,
    OptimConfig,
    PlanConfig,
    PrecisionConfig,
    RunConfig,
    TrainConfig,
)
from tandem.config.values import (  # noqa: F401 - re-exported
    parse_mix,
    parse_ramp,
    parse_seq_ramp,
    parse_target,
)
from tandem.parallel import registry as strategies

# Bounds that a type alone cannot say: field -> (minimum, human description).
_MINIMUM: dict[str, tuple[float, str]] = {
    "train.steps": (1, "an integer >= 1"),
    "train.global_batch": (1, "an integer >= 1"),
    "train.micro_batch": (0, "an integer >= 0"),
    "train.lora_rank": (0, "an integer >= 0 (0: off)"),
    "train.grad_clip": (0, "a number >= 0"),
    "train.eval_every": (0, "an integer >= 0"),
    "train.eval_batch": (1, "an integer >= 1"),
    "train.eval_from": (0, "an integer >= 0"),
    "train.ema_decay": (0, "a number in [0, 1)"),
    "train.label_smoothing": (0, "a number in [0, 1)"),
    "optim.cooldown_frac": (1e-9, "a number in (0, 1]"),
    "data.workers": (0, "an integer >= 0"),
    "data.prefetch": (1, "an integer >= 1"),
    "plan.bucket_mb": (0.001, "a number > 0"),
    "plan.timeout_s": (1, "a number >= 1"),
    "plan.sync_every": (1, "an integer >= 1"),
    "plan.outer_lr": (1e-9, "a number > 0"),
    "plan.outer_momentum": (0, "a number in [0, 1)"),
    "plan.fragments": (1, "an integer >= 1"),
    "plan.overlap_steps": (0, "an integer >= 0"),
    "plan.staleness": (0, "an integer >= 0"),
    "plan.merge_alpha": (0, "a number in [0, 1)"),
    "plan.powersgd_rank": (1, "an integer >= 1"),
    "plan.powersgd_warmup": (2, "an integer >= 2"),
    "precision.init_scale": (1, "a number >= 1"),
    "precision.growth_interval": (1, "an integer >= 1"),
    "optim.warmup_steps": (0, "an integer >= 0"),
    "optim.min_lr_ratio": (0, "a number in [0, 1]"),
    "optim.pct_start": (0, "a number in (0, 1)"),
    "optim.reference_batch": (0, "an integer >= 0"),
    "optim.momentum_min": (0, "a number in [0, 1)"),
    "optim.momentum_max": (0, "a number in [0, 1)"),
    "plan.tp": (1, "an integer >= 1"),
    "plan.pp": (1, "an integer >= 1"),
    "plan.pp_microbatches": (0, "an integer >= 0 (0: train.micro_batch decides)"),
    "plan.pp_virtual": (1, "an integer >= 1"),
    "plan.pp_watchdog_s": (0, "a number >= 0 (0: off)"),
    "plan.malloc_threshold_mb": (0, "a number in [0, 32]"),
    "plan.threads": (0, "an integer >= 0 (0: OMP_NUM_THREADS decides)"),
    "checkpoint.every": (0, "an integer >= 0"),
    "checkpoint.keep": (0, "an integer >= 0"),
    "monitor.log_every": (1, "an integer >= 1"),
    "monitor.calibrate_at": (0, "an integer >= 0"),
    "fault.rollback_lr_scale": (1e-6, "a number > 0"),
    "fault.max_rollbacks": (0, "an integer >= 0"),
    "fault.heartbeat_s": (0, "a number >= 0"),
}


def sections() -> dict[str, type]:
    """Section name -> dataclass type, in declaration order."""
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config)}


def _field_types(section_type: type) -> dict[str, Any]:
    return typing.get_type_hints(section_type)


def _coerce(path: str, value: Any, kind: Any) -> Any:
    """Convert a TOML or command-line value to the field's type, or raise ValueError."""
    if typing.get_origin(kind) is Literal:
        allowed = typing.get_args(kind)
        if value not in allowed:
            raise ValueError(f"{path}: {value!r} is not allowed; choose one of {list(allowed)}")
        return value
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"{path}: {value!r} is not a boolean; use true or false")
    if kind is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"{path}: {value!r} is not an integer")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{path}: {value!r} is not an integer") from None
    if kind is float:
        if isinstance(value, bool):
            raise ValueError(f"{path}: {value!r} is not a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{path}: {value!r} is not a number") from None
    if kind is str:
        return str(value)
    raise AssertionError(f"unsupported field type {kind!r} for {path}")


def _set(config: Config, path: str, value: Any) -> None:
    parts = path.split(".")
    known = sections()
    if len(parts) != 2 or parts[0] not in known:
        raise ValueError(
            f"unknown config key {path!r}; keys are <section>.<field> with sections {list(known)}"
        )
    section, name = parts
    types_ = _field_types(known[section])
    if name not in types_:
        raise ValueError(
            f"unknown config key {path!r}; fields of [{section}] are {list(types_)}"
        )
    setattr(getattr(config, section), name, _coerce(path, value, types_[name]))


def validate(config: Config) -> Config:
    """Check every value against its bounds; raise ValueError naming the first bad field."""
    for path, (minimum, allowed) in _MINIMUM.items():
        section, name = path.split(".")
        value = getattr(getattr(config, section), name)
        if value < minimum:
            raise ValueError(f"{path}: {value!r} is out of range; expected {allowed}")
    if not 0 < config.plan.topk_ratio <= 1:
        raise ValueError(f"plan.topk_ratio: {config.plan.topk_ratio!r} must be in (0, 1]")
    hooked = strategies.names("takes_comm_hook")
    if config.plan.comm_hook != "none" and config.plan.strategy not in hooked:
        raise ValueError(
            f"plan.comm_hook: {config.plan.comm_hook!r} applies to DDP; with plan.strategy "
            f"{config.plan.strategy!r} leave it 'none' ({strategies.FSDP.name}: set "
            "plan.fsdp_reduce_dtype)"
        )
    if config.plan.host_allreduce == "shared_memory" and (
            config.plan.comm_hook != "none"
            or config.plan.strategy not in strategies.names("takes_host_allreduce")
            or config.plan.tp > 1):
        raise ValueError(
            "plan.host_allreduce: 'shared_memory' carries DDP's plain gradient all-reduce; "
            f"with plan.strategy {config.plan.strategy!r}, plan.comm_hook "
            f"{config.plan.comm_hook!r} and plan.tp {config.plan.tp} use 'auto' or 'backend' "
            f"(it needs strategy {'/'.join(strategies.names('takes_host_allreduce'))}, "
            "comm_hook 'none' and tp 1)")
    if config.optim.min_lr_ratio > 1:
        raise ValueError(f"optim.min_lr_ratio: {config.optim.min_lr_ratio} must be <= 1")
    if not 0 < config.optim.pct_start < 1:
        raise ValueError(f"optim.pct_start: {config.optim.pct_start} must be in (0, 1)")
    if config.optim.lr_scaling != "none" and config.optim.reference_batch <= 0:
        raise ValueError(
            f"optim.reference_batch must be > 0 when optim.lr_scaling is "
            f"{config.optim.lr_scaling!r}: it is the batch the base lr was tuned for"
        )
    if config.train.target:
        parse_target(config.train.target)
    for name in ("ema_decay", "label_smoothing"):
        if (value := getattr(config.train, name)) >= 1:
            raise ValueError(f"train.{name}: {value!r} is out of range; expected a number "
                             "in [0, 1)")
    if config.optim.cooldown_frac > 1:
        raise ValueError(f"optim.cooldown_frac: {config.optim.cooldown_frac!r} is out of "
                         "range; expected a number in (0, 1]")
    if config.train.seq_ramp:
        parse_seq_ramp(config.train.seq_ramp)
    if config.data.mix:
        parse_mix(config.data.mix)
    _check_distill(config)
    if config.train.batch_ramp:
        parse_ramp(config.train.batch_ramp, config.train.global_batch)
        if "rollback" in (config.fault.nonfinite, config.fault.spike):
            raise ValueError("train.batch_ramp does not combine with rollbacks "
                             "(fault.nonfinite / fault.spike = 'rollback'): a rollback "
                             "re-runs steps whose batch size the ramp fixed; use 'skip'/'warn'")
    if config.optim.momentum_min > config.optim.momentum_max or config.optim.momentum_max >= 1:
        raise ValueError(f"optim.momentum_min {config.optim.momentum_min} / momentum_max "
                         f"{config.optim.momentum_max}: need 0 <= min <= max < 1")
    if (mb := config.plan.malloc_threshold_mb) > 32:
        raise ValueError(f"plan.malloc_threshold_mb: {mb} is above glibc's limit of 32 (MiB)")
    if (config.plan.tp > 1 and config.plan.pp == 1
            and config.plan.strategy not in strategies.names("takes_tp")):
        raise ValueError(f"plan.tp: {config.plan.tp} combines tensor parallelism with plain "
                         f"data parallelism; plan.strategy {config.plan.strategy!r} does not "
                         "compose with it here: use "
                         f"{strategies.either(strategies.names('takes_tp'))}")
    if config.plan.tp > 1 and config.plan.comm_hook != "none":
        raise ValueError(f"plan.comm_hook: {config.plan.comm_hook!r} is a DDP hook; with "
                         f"plan.tp {config.plan.tp} the gradients are averaged by tandem's own "
                         "all-reduce: leave it 'none'")
    if config.plan.strategy in strategies.names("meets_every"):
        _check_low_communication(config)
    if config.plan.pp > 1:
        _check_pipeline(config)
    if config.monitor.prometheus_port < -1 or config.monitor.prometheus_port > 65535:
        raise ValueError(f"monitor.prometheus_port: {config.monitor.prometheus_port} must be "
                         "-1 (off), 0 (a free port) or a port number")
    if config.run.name and ("/" in config.run.name or config.run.name in (".", "..")):
        raise ValueError(f"run.name: {config.run.name!r} must be a plain name without '/'")
    return config


def _check_distill(config: Config) -> None:
    train = config.train
    if not train.distill_temperature > 0:
        raise ValueError(f"train.distill_temperature: {train.distill_temperature!r} is out "
                         "of range; expected a number > 0")
    if not 0 <= train.distill_ratio <= 1:
        raise ValueError(f"train.distill_ratio: {train.distill_ratio!r} is out of range; "
                         "expected a number in [0, 1]")
    if not train.distill_cache_mb >= 0:
        raise ValueError(f"train.distill_cache_mb: {train.distill_cache_mb!r} is out of "
                         "range; expected a number >= 0 (0: off)")


def _check_pipeline(config: Config) -> None:
    plan = config.plan
    if plan.strategy not in ("auto", "ddp", "fsdp"):
        raise ValueError(f"plan.pp: {plan.pp} pipeline stages combine with data-parallel "
                         f"replicas or shards (and plan.tp) only; plan.strategy "
                         f"{plan.strategy!r} does not compose with them here: use 'auto', "
                         "'ddp' or 'fsdp'")
    if config.precision.mode == "fp16":
        raise ValueError("plan.pp: precision.mode 'fp16' needs one loss scale agreed by "
                         "every stage, which the pipeline does not do; use 'bf16' or 'fp32'")
    if config.train.batch_ramp:
        raise ValueError("plan.pp: train.batch_ramp changes the micro-batches per step, which "
                         "a pipeline schedule fixes; leave train.batch_ramp empty")
    if plan.comm_hook != "none":
        raise ValueError(f"plan.comm_hook: {plan.comm_hook!r} is a DDP hook; under plan.pp "
                         "the replicas average their gradients themselves: leave it 'none'")
    if plan.pp_microbatches:
        from tandem.parallel import schedules  # a strategy's module: imported when used

        schedules.check(plan.pp_schedule, plan.pp, plan.pp_virtual, plan.pp_microbatches)


def _check_low_communication(config: Config) -> None:
    plan = config.plan
    if plan.outer_momentum >= 1:
        raise ValueError(f"plan.outer_momentum: {plan.outer_momentum} must be < 1")
    if plan.strategy == strategies.STREAMING_DILOCO.name:
        if plan.merge_alpha >= 1:
            raise ValueError(f"plan.merge_alpha: {plan.merge_alpha} must be < 1 (1 would "
                             "never take the outer values)")
        if plan.overlap_steps >= plan.sync_every:
            raise ValueError(f"plan.overlap_steps: {plan.overlap_steps} must be < "
                             f"plan.sync_every ({plan.sync_every}): a part's sum is merged "
                             "before the part meets again")
        if plan.fragments > plan.sync_every:
            raise ValueError(f"plan.fragments: {plan.fragments} must be <= plan.sync_every "
                             f"({plan.sync_every}): each part meets at a step of its own")
    if plan.strategy == strategies.ASYNC.name:
        _check_async(config)
    every = config.checkpoint.every
    if every and every % plan.sync_every and not strategies.REGISTRY[plan.strategy].saves_replicas:
        raise ValueError(
            f"checkpoint.every: {every} must be a multiple of plan.sync_every "
            f"({plan.sync_every}) with plan.strategy {plan.strategy!r}: between meetings the "
            "replicas differ and a checkpoint would keep only one of them"
        )
    if config.fault.nonfinite == "rollback":
        raise ValueError(
            f"fault.nonfinite: 'rollback' needs the ranks to agree every step, which "
            f"plan.strategy {plan.strategy!r} avoids; use 'skip' (each replica skips its own "
            "bad update) or 'raise'"
        )


def _check_async(config: Config) -> None:
    for name, value in (("batch_ramp", config.train.batch_ramp),
                        ("seq_ramp", config.train.seq_ramp)):
        if value:
            raise ValueError(f"train.{name}: plan.strategy 'async' gives out the shares of "
                             "equal global batches to whichever worker is free; leave it "
                             "empty")
    if config.fault.spike == "rollback":
        raise ValueError("fault.spike: 'rollback' needs the workers to agree on one step, "
                         "which plan.strategy 'async' avoids; use 'warn'")
    if config.plan.pp > 1 or config.plan.tp > 1:
        raise ValueError("plan.strategy 'async': each worker is one process holding the whole "
                         "model; leave plan.pp and plan.tp at 1")


def _apply_toml(config: Config, path: str | Path, what: str) -> None:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{what} {str(path)!r} does not exist")
    with path.open("rb") as handle:
        try:
            document = tomllib.load(handle)
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{what} {str(path)!r} is not valid TOML: {err}") from None
    for section, values in document.items():
        if not isinstance(values, dict):
            raise ValueError(f"{path}: top-level key {section!r} must be a [section] table")
        for name, value in values.items():
            _set(config, f"{section}.{name}", value)


def load(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
         defaults: dict[str, Any] | None = None, plan: str | Path | None = None) -> Config:
    """Build a validated Config. Layers, later ones winning: `defaults` (the script's), the
    TOML config file, the plan file (TOML, e.g. written by `tandem tune`), the overrides."""
    config = Config()
    for key, value in (defaults or {}).items():
        _set(config, key, value)
    if path is not None:
        _apply_toml(config, path, "config file")
    if plan is not None:
        _apply_toml(config, plan, "plan file")
    for key, value in (overrides or {}).items():
        _set(config, key, value)
    return validate(config)


def plan_overrides(plan: str | Path, overrides: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The keys the plan file sets that a flag sets to another value, as (key, the plan's
    value, the flag's value): flags win (`load`), and a tuned plan overridden without a
    word runs another plan than the one the user believes."""
    with Path(plan).open("rb") as handle:
        document = tomllib.load(handle)
    planned = {f"{section}.{name}" for section, values in document.items()
               if isinstance(values, dict) for name in values}
    ours, theirs = Config(), Config()
    _apply_toml(ours, plan, "plan file")
    found = []
    for key in sorted(planned & set(overrides)):
        _set(theirs, key, overrides[key])
        section, name = key.split(".")
        mine, flag = getattr(getattr(ours, section), name), getattr(getattr(theirs, section), name)
        if mine != flag:
            found.append((key, mine, flag))
    return found


@dataclass
class Args:
    """A script's command line, split: `--config FILE`, `--plan FILE`, overrides, `--help`."""

    config: str | None = None
    plan: str | None = None
    overrides: dict[str, str] = field(default_factory=dict)
    help: bool = False


def parse_args(argv: list[str]) -> Args:
    """Split `--config FILE`, `--plan FILE`, `--section.field VALUE` (or `=VALUE`) and `--help`
    out of argv."""
    args = Args()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            args.help = True
            i += 1
            continue
        if not arg.startswith("--"):
            raise ValueError(f"unexpected argument {arg!r}; use --config FILE, --plan FILE or "
                             "--section.field VALUE")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(argv):
                raise ValueError(f"option {arg!r} needs a value")
            value = argv[i + 1]
            i += 1
        if key == "config":
            args.config = value
        elif key == "plan":
            args.plan = value
        else:
            args.overrides[key] = value
        i += 1
    return args


USAGE = """Usage: SCRIPT [--config FILE.toml] [--plan FILE.toml] [--section.key VALUE ...]

  --config FILE   a TOML file of settings ([section] key = value), over the script's recipe
  --plan FILE     a TOML plan (e.g. from `tandem tune`), over --config; also TANDEM_PLAN
  --section.key   one setting (or --section.key=VALUE); flags win over both files
  -h, --help      this text
"""


def reference(recipe: dict[str, Any] | None = None) -> str:
    """A readable list of every config field, its value and what it does.

    With `recipe` (a script's own defaults, {"train.steps": 500}), each value shown is the
    one the script runs with, and marked as the script's; without, the library default.
    """
    recipe = recipe or {}
    lines = ["Options (TOML [section] key = value, or --section.key VALUE):", ""]
    for section, kind in sections().items():
        lines.append(f"[{section}]  {kind.__doc__}")
        hints = _field_types(kind)
        for f in dataclasses.fields(kind):
            choices = typing.get_args(hints[f.name])
            shown = "|".join(choices) if typing.get_origin(hints[f.name]) is Literal else None
            kind_name = shown or getattr(hints[f.name], "__name__", str(hints[f.name]))
            key = f"{section}.{f.name}"
            value = recipe.get(key, f.default)
            value = value if not isinstance(value, str) else repr(value)
            origin = "script's recipe" if key in recipe else "default"
            lines.append(f"  --{key} ({kind_name}, {origin} {value})")
            lines.append(f"      {f.metadata.get('doc', '')}")
        lines.append("")
    return "\n".join(lines)


def config_from_dict(data: dict[str, Any]) -> Config:
    """The Config a `to_dict()` recorded (keys this version does not know are skipped)."""
    config = Config()
    for section, fields in data.items():
        for key, value in (fields.items() if isinstance(fields, dict) else ()):
            try:
                _set(config, f"{section}.{key}", value)
            except ValueError:
                continue
    return config
