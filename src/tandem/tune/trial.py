"""One trial run: `tandem run` in a subprocess under a plan file, its figures from the store.

Each run is a real job in a real process group, launched exactly as a user would
launch it (`tandem run --nproc-per-node N --plan TRIAL.toml script ...`), with a
timeout. A crash, an out-of-memory kill, a hang or a nonzero exit becomes a failed
`RunOutcome` that says why; it never raises.

A trial keeps the job's own evaluation and checkpoint cadence (their cost is part of
what the user waits for) and sets: its steps, its run name and store, no progress bar,
no checkpoint at the end, the link calibration in the first window (dropped as warm-up,
so its cost is never counted), and a logging window of the tuner's size or the job's,
whichever is more frequent (a job that logs every step pays for it in every trial).
The checkpoints a trial wrote are deleted once its figures are read.

Workers start warm (`warm_workers`): the session runs a fork server (the scheduler's,
`tandem/forking/server.py`) that has imported torch once, and each trial's launcher forks
its ranks from it, so a run's start-up costs a fraction of a cold one's and a session's
budget goes to measuring. The runs' figures do not include start-up (the first window
is warm-up), so a run that started cold (the server not listening after SERVER_WAIT_S,
or where a warm worker could differ from a cold one: the launcher says so in its log)
compares fairly with one that started warm; a run waits for a server still importing,
since a cold start costs more than that wait. A job whose processes start with more than one thread
each starts its trials cold (`warm_workers` says why).

A run's timeout (--trial-timeout) is capped by what is left of the session's budget
(`deadline`, set by the session), but never below `min_timeout_s` (what a run needs to
start and measure anything): a run that hits the cap is `budget_cut`, recorded by the
session as a candidate it never reached, not as one that failed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.config.schema import _toml_value
from tandem.forking.wire import FORKSERVER_ENV
from tandem.monitor.catalogue import LOSS, SAMPLES_PER_S, TASK_PREFIX, TIME_STEP
from tandem.monitor.store import RunStore
from tandem.status import RunStatus
from tandem.tune import shim
from tandem.tune.space import DATA_CONTROL
from tandem.tune.stats import WindowFigure, run_rates

# Flags every trial sets itself; the same flags among the script's own are dropped.
log = logging.getLogger("tandem")
OWN_FLAGS = ("train.steps", "monitor.log_every", "run.dir", "run.name", "run.resume",
             "monitor.store", "monitor.progress", "monitor.report", "checkpoint.at_end",
             "monitor.calibrate_at", "run.kind")
# Run names end in the arm's tag; these tags' runs measure noise or a cause (run.kind
# control), every other trial run is a trial (`tandem runs` lists neither by default).
CONTROL_TAGS = ("placebo", "control")
CALIBRATE_AT = 1  # the link's cost is measured in the first window, which warm-up drops
TAIL_CHARS = 2000
POLL_S = 1.0  # how often a watched run is looked at
SERVER_WAIT_S = 60.0  # how long a run waits for the session's fork server to listen


@dataclass
class RunOutcome:
    """What one trial run produced."""

    name: str
    ok: bool
    run_id: str = ""
    rates: list[float] = field(default_factory=list)  # samples/s per logging window
    windows: list[WindowFigure] = field(default_factory=list)
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, window loss)
    wall_s: float = 0.0
    error: str = ""
    summary: dict[str, Any] = field(default_factory=dict)
    stopped: bool = False  # the watcher ended the run early (a pruned trial)
    budget_cut: bool = False  # killed at the timeout the session's remaining budget capped
    # a mixture's figures per source (task/NAME/...): [(seconds since its first step, value)]
    tasks: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    @property
    def figures(self) -> dict[str, float]:
        """The run's steady throughput, {'wall': samples/s, 'step': samples/s}."""
        return run_rates(self.windows)


def run_kind(name: str, control: str) -> str:
    """run.kind of a trial run: control for a control or placebo arm's run, else trial."""
    return "control" if control or name.rsplit("-", 1)[-1] in CONTROL_TAGS else "trial"


def plan_toml(changes: Mapping[str, Any], header: Sequence[str] = ()) -> str:
    """A plan file holding `changes` ({'data.workers': 2}), grouped by section."""
    by_section: dict[str, list[tuple[str, Any]]] = {}
    for key, value in changes.items():
        section, _, name = key.partition(".")
        by_section.setdefault(section, []).append((name, value))
    lines = [f"# {h}" for h in header]
    for section, items in by_section.items():
        lines += ["", f"[{section}]"] + [f"{n} = {_toml_value(v)}" for n, v in items]
    return "\n".join(lines).lstrip("\n") + "\n"


def strip_flags(args: Sequence[str], keys: Sequence[str]) -> list[str]:
    """The script flags without `--key VALUE` / `--key=VALUE` for each of `keys`."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        key = arg[2:].partition("=")[0] if arg.startswith("--") else None
        if key in keys:
            i += 1 if "=" in arg else 2
            continue
        out.append(arg)
        i += 1
    return out


def flag_keys(args: Sequence[str]) -> list[str]:
    """The config keys the script flags set (`--train.steps 5` -> 'train.steps')."""
    return [a[2:].partition("=")[0] for a in args if a.startswith("--") and "." in a]


@dataclass
class TrialRunner:
    """Launches trial runs of one script and reads them back from the run store."""

    script: str
    script_args: list[str]
    nproc: int
    work_dir: Path
    store_path: Path
    base_plan: dict[str, Any] = field(default_factory=dict)  # the user's --plan, flat
    timeout_s: float = 300.0
    env: dict[str, str] = field(default_factory=dict)
    runs: int = 0  # runs launched so far
    job_log_every: int | None = None  # the job's own monitor.log_every, once known
    sample_s: float | None = None  # one training sample's read time (`resolve`), if known
    forkserver: Any = None  # the session's fork server (`warm_workers`), once started
    deadline: float | None = None  # time.monotonic() when the session's budget ends
    min_timeout_s: float = 45.0  # a run's timeout is never capped below this

    def limit(self, now: float) -> tuple[float, bool]:
        """(the timeout of a run starting at `now`, whether the budget capped it):
        timeout_s, or the budget left (`deadline`) when less, but at least min_timeout_s."""
        if self.deadline is None:
            return self.timeout_s, False
        left = max(self.min_timeout_s, self.deadline - now)
        return (left, True) if left < self.timeout_s else (self.timeout_s, False)

    def command(self, name: str, plan_file: Path, steps: int, log_every: int,
                control: str, drop: Sequence[str], eval_every: int | None = None,
                calibrate_at: int = CALIBRATE_AT) -> list[str]:
        """The `tandem run` command line of one trial run (`eval_every` None: the job's)."""
        own = [*OWN_FLAGS, *drop, *(["train.eval_every"] if eval_every is not None else [])]
        args = strip_flags(self.script_args, own)
        script = [self.script]
        if control == DATA_CONTROL:
            script = [shim.__file__, self.script]
        cmd = [sys.executable, "-m", "tandem.cli", "run", "--nproc-per-node", str(self.nproc),
               "--plan", str(plan_file), *script, *args,
               "--train.steps", str(steps), "--monitor.log_every", str(log_every),
               "--run.dir", str(self.work_dir / "runs"), "--run.name", name,
               "--run.resume", "never", "--monitor.store", str(self.store_path),
               "--monitor.progress", "off", "--monitor.report", "false",
               "--checkpoint.at_end", "false",
               "--monitor.calibrate_at", str(calibrate_at),
               "--run.kind", run_kind(name, control)]
        if eval_every is not None:
            cmd += ["--train.eval_every", str(eval_every)]
        return cmd

    def run(self, name: str, changes: Mapping[str, Any], steps: int, log_every: int,
            control: str = "", eval_every: int | None = None,
            watch: Callable[[], bool] | None = None) -> RunOutcome:
        """Run the script for `steps` steps under base plan + `changes`; never raises.

        The logging window is `log_every` steps, or the plan's own monitor.log_every
        when that is more frequent (`job_log_every`, else the value in `changes`).
        `watch`, when given, is called every POLL_S seconds while the run goes; when it
        returns True the run is stopped there (`RunOutcome.stopped`).
        """
        self.runs += 1
        self.work_dir.mkdir(parents=True, exist_ok=True)
        plan = {**self.base_plan, **changes}
        # Calibration happens in every trial unless the arm itself turns it off (the
        # no-communication control: nothing to calibrate).
        calibrate_at = CALIBRATE_AT if changes.get("monitor.calibrate_at", 1) else 0
        plan_file = self.work_dir / f"{name}.toml"
        plan_file.write_text(plan_toml(plan, [f"trial run {name}"]))
        # A script flag would win over the plan file: drop those the trial changes.
        cmd = self.command(name, plan_file, steps, self.window(changes, log_every), control,
                           list(changes), eval_every, calibrate_at)
        log_file = self.work_dir / f"{name}.log"
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               **self.env}
        if self.forkserver is not None and self._server_ready():
            env[FORKSERVER_ENV] = self.forkserver.path
        started = time.monotonic()
        timeout, capped = self.limit(started)
        with log_file.open("w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
            code, error, stopped = self._wait(proc, started, watch, timeout, capped)
        outcome = self.read(name)
        outcome.wall_s, outcome.stopped = time.monotonic() - started, stopped
        outcome.budget_cut = capped and error.startswith("timed out")
        shutil.rmtree(self.work_dir / "runs" / name / "checkpoints", ignore_errors=True)
        if code is not None and code != 0 and not stopped:
            how = f"signal {-code}" if code < 0 else f"exit status {code}"
            error = f"{how}: {_tail(log_file)}"
        if error:
            outcome.ok, outcome.error = False, error
        elif not outcome.rates and not stopped:
            outcome.ok = False
            outcome.error = outcome.error or f"no throughput recorded: {_tail(log_file)}"
        return outcome

    def _server_ready(self) -> bool:
        """Whether the fork server listens, waiting up to SERVER_WAIT_S for one still
        importing: a cold start imports torch in every rank while the server imports it
        too (on 2 cores at load 13 a cold start took 23 s, a forked one under 1 s)."""
        end = time.monotonic() + SERVER_WAIT_S
        while not self.forkserver.ready():
            if self.forkserver.gone() or time.monotonic() >= end:
                return False
            time.sleep(0.2)
        return True

    def window(self, changes: Mapping[str, Any], log_every: int) -> int:
        """A trial's logging window: `log_every`, or the plan's own when more frequent."""
        own = (changes.get("monitor.log_every") or self.job_log_every
               or self.base_plan.get("monitor.log_every") or log_every)
        return min(int(log_every), int(own))

    def resolve(self, timeout_s: float = 120.0) -> dict[str, Any]:
        """The job's resolved settings, flat ({'train.micro_batch': 0, ...}), read without
        training (`shim.py --resolve`); {} when the script cannot tell them. Sets
        `sample_s` when the shim could time the training set's samples."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        plan_file = self.work_dir / "resolve-plan.toml"
        plan_file.write_text(plan_toml(self.base_plan, ["the job's own plan"]))
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               **self.env, "TANDEM_PLAN": str(plan_file)}
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)
        try:
            proc = subprocess.run([sys.executable, shim.__file__, "--resolve", self.script,
                                   *self.script_args], capture_output=True, text=True,
                                  env=env, timeout=timeout_s, cwd=self.work_dir)
        except subprocess.TimeoutExpired:
            return {}
        resolved: dict[str, Any] = {}
        for line in proc.stdout.splitlines():
            if line.startswith(shim.DATA_MARK):
                cost = json.loads(line[len(shim.DATA_MARK):])
                self.sample_s = float(cost["sample_s"])
            elif line.startswith(shim.RESOLVED_MARK):
                tree = json.loads(line[len(shim.RESOLVED_MARK):])
                resolved = {f"{s}.{k}": v for s, values in tree.items()
                            if isinstance(values, dict) for k, v in values.items()}
        return resolved

    def _wait(self, proc: subprocess.Popen, started: float,
              watch: Callable[[], bool] | None, timeout: float | None = None,
              capped: bool = False) -> tuple[int | None, str, bool]:
        """(exit code or None, error, stopped by the watcher) once the run has ended or
        `timeout` (default timeout_s) passed; `capped`: the budget capped that timeout."""
        timeout = self.timeout_s if timeout is None else timeout
        while True:
            left = timeout - (time.monotonic() - started)
            try:
                return proc.wait(timeout=max(0.0, min(left, POLL_S if watch else left))), "", False
            except subprocess.TimeoutExpired:
                pass
            if watch is not None and watch():
                _kill_group(proc)
                return None, "", True
            if time.monotonic() - started >= timeout:
                _kill_group(proc)
                why = (f" (--trial-timeout {self.timeout_s:.0f} s capped to the session's "
                       "budget left)" if capped else "")
                return None, f"timed out after {timeout:.0f} s{why} (killed)", False

    def read(self, name: str) -> RunOutcome:
        """The figures run `name` left in the store (ok=False when there are none)."""
        if not self.store_path.is_file():
            return RunOutcome(name, ok=False, error="no run store was written")
        with RunStore(self.store_path) as store:
            try:
                run = store.run(name)
            except ValueError:
                return RunOutcome(name, ok=False, error="the run never started")
            rid = run["run_id"]
            rate_rows = store.metrics(rid, name=SAMPLES_PER_S, rank=-1)
            step_s = {m["step"]: m["value"] for m in store.metrics(rid, name=TIME_STEP,
                                                                   rank=-1)}
            losses = [(m["step"], m["value"]) for m in store.metrics(rid, name=LOSS, rank=-1)]
            tasks = _tasks(store.metrics(rid, rank=-1), run.get("summary") or {})
        return RunOutcome(name, ok=run["status"] == RunStatus.COMPLETED, run_id=rid,
                          rates=[m["value"] for m in rate_rows if math.isfinite(m["value"])],
                          windows=windows_of(rate_rows, step_s), losses=losses,
                          summary=run.get("summary") or {}, tasks=tasks,
                          error="" if run["status"] == RunStatus.COMPLETED else
                          f"run status {run['status']}")


def threads_per_process(runner: TrialRunner) -> int:
    """The OMP_NUM_THREADS the job's processes start with (1 when unset or unreadable)."""
    value = runner.env.get("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    return int(value) if value.isdigit() else 1


def _tasks(rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]
           ) -> dict[str, list[tuple[float, float]]]:
    """A mixture's per-source rows by name, timed from the run's first step."""
    started = summary.get("train_started_at")
    out: dict[str, list[tuple[float, float]]] = {}
    if not isinstance(started, int | float):
        return out
    for row in sorted(rows, key=lambda r: r["step"]):
        if row["name"].startswith(TASK_PREFIX):
            out.setdefault(row["name"], []).append((row["time"] - started, row["value"]))
    return out


@contextmanager
def warm_workers(runner: TrialRunner, enabled: bool = True) -> Iterator[None]:
    """While it lasts, `runner`'s trials fork their ranks from a fork server started
    here (each run once the server listens); the server is stopped at the end.

    Not for a job that starts its processes with more than one thread each: a forked
    worker gets its OMP_NUM_THREADS after the fork (`torch.set_num_threads`), which
    does not reproduce a process that started with it. Measured on 2 cores under
    other work (load 22-30): with OMP_NUM_THREADS=4 on 2 ranks, cold runs made 44-90
    samples/s and warm-forked ones 967-2,400 (1 thread: 459-1,079 either way), so the
    trials would judge a job that is not the one the user runs."""
    if not enabled or threads_per_process(runner) > 1:
        if enabled:
            log.info("trials start cold: the job's processes start with %d threads each",
                     threads_per_process(runner))
        yield
        return
    from tandem.sched.backends.local_backend import ForkServer

    server = ForkServer()
    runner.forkserver = server
    try:
        yield
    finally:
        runner.forkserver = None
        server.close()


def windows_of(rate_rows: Sequence[Mapping[str, Any]],
               step_s: Mapping[int, float]) -> list[WindowFigure]:
    """Each window's samples, training seconds and closing time, from its samples/s rows
    and its seconds per step (samples = rate x seconds per step x steps in the window)."""
    out: list[WindowFigure] = []
    previous = 0
    for row in sorted(rate_rows, key=lambda r: r["step"]):
        step, rate, per_step = row["step"], row["value"], step_s.get(row["step"])
        steps = step - previous
        previous = step
        if per_step is None or not (math.isfinite(rate) and math.isfinite(per_step)):
            continue
        busy = per_step * steps
        out.append(WindowFigure(step, rate * busy, busy, float(row["time"])))
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the trial's process group (launcher and ranks), then SIGKILL."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and "│" not in ln]
    return " | ".join(lines[-6:])[-TAIL_CHARS:]
