"""Submitting a job: the request (from the command line or the API) checked and stored.

Submission writes the job straight into the store (the source of truth), so it works
whether or not the service runs; the service picks the job up at its next tick.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tandem.sched.backends.backend import flag_value
from tandem.sched.service.jobstore import SchedStore
from tandem.sched.service.records import JobRecord

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Options of `tandem submit` itself; anything else after the script is the script's.
VALUE_OPTIONS = ("--procs", "--priority", "--name", "--max-batch", "--store", "--env")
FLAG_OPTIONS = ("--adaptive-batch",)

USAGE = """usage: tandem submit SCRIPT [SCRIPT FLAGS ...] [--procs MIN:MAX] [--priority P]
                     [--name NAME] [--adaptive-batch] [--max-batch B] [--env KEY=VALUE]
                     [--store PATH]

Queue a training script (run by the scheduler as `tandem run --nproc-per-node N SCRIPT ...`)
and print its job id. Works whether or not `tandem scheduler` is running.

  --procs MIN:MAX    processes the job accepts (or one number for a rigid job; default 1)
  --priority P       larger is admitted first by the goodput policy (default 0)
  --name NAME        a label (default: the script's name); the run is NAME-<job id>
  --adaptive-batch   let the scheduler change train.global_batch for goodput (relaunches
                     pass --run.allow_changes train.global_batch; the script's own
                     --optim.lr_scaling applies); used only once the job measures its
                     gradient noise scale
  --max-batch B      largest global batch an adaptive job may get (default 4 x its own)
  --env KEY=VALUE    an environment variable for the job (repeatable)
  --store PATH       the run store (default: $TANDEM_STORE, else runs/tandem.db)"""


@dataclass
class SubmitRequest:
    """What a submission asks for, before it is checked."""

    script: str
    args: list[str] = field(default_factory=list)
    procs: str = "1"
    priority: int = 0
    name: str | None = None
    adaptive_batch: bool = False
    max_batch: int = 0
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = field(default_factory=os.getcwd)
    store: str | None = None


def split_argv(argv: Sequence[str]) -> SubmitRequest:
    """Separate `tandem submit`'s own options from the script and its flags (any order)."""
    own: dict[str, list[str]] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, value = arg.partition("=")
        if key in VALUE_OPTIONS:
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"{arg} needs a value")
                value = argv[i + 1]
                i += 1
            own.setdefault(key, []).append(value)
        elif arg in FLAG_OPTIONS:
            own[arg] = ["1"]
        else:
            rest.append(arg)
        i += 1
    if not rest or rest[0].startswith("-"):
        raise ValueError("a script to run is needed: tandem submit SCRIPT [FLAGS ...]"
                         + (f" (got {rest[0]!r})" if rest else ""))
    env = {}
    for item in own.get("--env", []):
        k, eq, v = item.partition("=")
        if not eq or not k:
            raise ValueError(f"--env: {item!r} is not KEY=VALUE")
        env[k] = v
    return SubmitRequest(
        script=rest[0], args=rest[1:], procs=own.get("--procs", ["1"])[-1],
        priority=_int("--priority", own.get("--priority", ["0"])[-1]),
        name=own.get("--name", [None])[-1], adaptive_batch="--adaptive-batch" in own,
        max_batch=_int("--max-batch", own.get("--max-batch", ["0"])[-1]), env=env,
        store=own.get("--store", [None])[-1])


def _int(option: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{option}: {text!r} is not an integer") from None


def parse_procs(text: str) -> tuple[int, int]:
    """`MIN:MAX` or `N` -> (min, max), both >= 1 and min <= max."""
    low, colon, high = str(text).partition(":")
    try:
        lo, hi = int(low), int(high if colon else low)
    except ValueError:
        raise ValueError(f"--procs: {text!r} is not MIN:MAX or N (integers)") from None
    if lo < 1 or hi < lo:
        raise ValueError(f"--procs: {text!r}; need 1 <= MIN <= MAX")
    return lo, hi


def make_record(request: SubmitRequest, store: Path) -> JobRecord:
    """A checked job record (paths made absolute, run directory and store settled)."""
    cwd = Path(request.cwd).resolve()
    script = (cwd / request.script).resolve()
    if not script.is_file():
        raise ValueError(f"script {request.script!r} does not exist (looked in {cwd})")
    low, high = parse_procs(request.procs)
    name = request.name or script.stem
    if not NAME_PATTERN.match(name):
        raise ValueError(f"--name: {name!r}; use letters, digits, '_', '.', '-' (<= 64)")
    if request.max_batch < 0:
        raise ValueError(f"--max-batch: {request.max_batch}; need >= 0 (0: 4 x the job's own)")
    given_store = flag_value(request.args, "monitor.store")
    if given_store is not None and (cwd / given_store).resolve() != store:
        raise ValueError(f"--monitor.store: {given_store!r} is not the scheduler's store "
                         f"{store}; the scheduler reads each job's measurements there (drop "
                         "the flag, or submit with --store)")
    run_dir = flag_value(request.args, "run.dir")
    run_name = flag_value(request.args, "run.name") or ""
    return JobRecord(
        name=name, script=str(script), args=list(request.args), cwd=str(cwd),
        env=dict(request.env), min_procs=low, max_procs=high, priority=request.priority,
        adaptive_batch=request.adaptive_batch, max_batch=request.max_batch,
        run_name=run_name, run_dir=str((cwd / run_dir).resolve() if run_dir else store.parent),
        submitted=time.time())


def submit(request: SubmitRequest, store: Path) -> JobRecord:
    """Check and store one job; returns it with its id."""
    record = make_record(request, store)
    with SchedStore(store) as sched:
        return sched.submit(record)


def from_json(body: Mapping[str, object]) -> SubmitRequest:
    """A request from the API's JSON body (the same fields as the command line)."""
    known = {"script", "args", "procs", "priority", "name", "adaptive_batch", "max_batch",
             "env", "cwd"}
    unknown = set(body) - known
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}; allowed: {sorted(known)}")
    if not isinstance(body.get("script"), str):
        raise ValueError("script: a path (string) is needed")
    args = body.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError("args: a list of strings is needed")
    env = body.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ValueError("env: an object of strings is needed")
    return SubmitRequest(
        script=str(body["script"]), args=list(args), procs=str(body.get("procs", "1")),
        priority=_int("priority", str(body.get("priority", 0))),
        name=str(body["name"]) if body.get("name") else None,
        adaptive_batch=bool(body.get("adaptive_batch", False)),
        max_batch=_int("max_batch", str(body.get("max_batch", 0))),
        env={str(k): str(v) for k, v in env.items()},
        cwd=str(body.get("cwd") or os.getcwd()))
