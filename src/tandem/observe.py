"""Observe an unmodified training script: step time, per-rank skew, memory, samples/s.

`python -m tandem.observe SCRIPT [ARGS...]` (what `tandem run --observe` runs under
torchrun, one process per rank) installs process-wide hooks, then runs SCRIPT as
`__main__` with its own argv. The script does not import tandem.

- Each step of the first optimizer that steps is a training step (a second one, as
  in a GAN, would count each step twice). Per step the hooks only read the host
  clock: no collective, no device sync.
- Every TANDEM_OBSERVE_EVERY steps (default 20) a window closes: on CUDA the device is
  synchronised once, and one `all_gather` of a fixed-size vector per rank brings the
  figures to rank 0, which writes them into the run store (`store_location`: TANDEM_STORE,
  default runs/tandem.db here). The gather runs inside the optimizer step, at the same step
  count on every rank (DDP ranks step together). Before the script creates its process
  group, and after it destroys it, windows stay local.
- The batch size comes from the first tensor argument of the outermost
  DistributedDataParallel forward (with grad enabled, so evaluation does not count).

A rank's straggler score is its time outside the last backward over the median
rank's: DDP makes every rank wait for the slowest inside backward (the gradient
all-reduce), so whole step times come out equal on every rank and would hide the
straggler. Without a DDP forward to time, the score is step time over the median.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import runpy
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from tandem.monitor.catalogue import (
    MEM_CUDA_PEAK,
    MEM_CUDA_TOTAL,
    SAMPLES_PER_S,
    STRAGGLER_SCORE,
    TIME_BACKWARD_SYNC,
    TIME_FORWARD,
    TIME_STEP,
)
from tandem.monitor.detect import HealthDetectors
from tandem.monitor.live import Window
from tandem.monitor.recorder import Recorder, new_run_id
from tandem.monitor.store import store_location
from tandem.monitor.window import Row, gather, gather_device, rank_rows
from tandem.status import RunStatus

log = logging.getLogger("tandem")

EVERY_ENV = "TANDEM_OBSERVE_EVERY"
DEFAULT_EVERY = 20
# One window of one rank, in this order, as one float64 vector.
FIELDS = ("steps", "seconds", "backward", "forward", "samples", "rss", "cuda_peak",
          "cuda_total", "timed")
USAGE = "usage: python -m tandem.observe SCRIPT [ARGS...]"
# Seconds the main thread sleeps (so releases the GIL) before it drops the process
# groups it kept: ample for gloo's worker threads to free their last work.
RELEASE_PAUSE_S = 0.05


def observe_every(environ: Mapping[str, str] = os.environ) -> int:
    """Steps per window, from TANDEM_OBSERVE_EVERY (a positive integer; default 20)."""
    text = environ.get(EVERY_ENV, "").strip()
    if not text:
        return DEFAULT_EVERY
    try:
        every = int(text)
    except ValueError:
        every = 0
    if every < 1:
        raise ValueError(f"{EVERY_ENV}={text!r}: must be a positive integer (steps per window)")
    return every


def leading_dim(args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    """The batch size: the leading dimension of the first tensor argument (0 if none).

    Looks one level into lists, tuples and dicts ((x, y) pairs, dicts of tensors).
    """
    for value in (*args, *kwargs.values()):
        inner = value.values() if isinstance(value, Mapping) else (
            value if isinstance(value, list | tuple) else (value,))
        for item in inner:
            if isinstance(item, torch.Tensor) and item.dim() > 0:
                return int(item.shape[0])
    return 0


def _cuda_live() -> bool:
    # is_initialized: a CPU script must not have CUDA initialised behind its back.
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class StepObserver:
    """Times optimizer steps and DDP forwards on one rank; rank 0 records windows."""

    def __init__(self, every: int, rank: int, world_size: int,
                 recorder: Recorder | None) -> None:
        self.every, self.rank, self.world = every, rank, world_size
        self.recorder = recorder
        self.detectors = HealthDetectors()
        self.step = 0
        self._pacer: weakref.ref[torch.optim.Optimizer] | None = None
        self._t0: float | None = None  # start of the open window (None before step 1)
        self._started = time.perf_counter()
        self._process = psutil.Process()
        self._gather = True
        self._depth = 0  # nesting of DDP forwards: only the outermost one counts
        self._handles: list[Any] = []
        self._original_forward: Callable[..., Any] | None = None
        self._groups: list[Any] = []  # process groups kept alive (see release_groups)
        self._job = {"samples": 0.0, "seconds": 0.0}
        self._reset()

    def _reset(self) -> None:
        self._steps = 0
        self._backward = self._forward = 0.0
        self._samples = 0
        self._timed = False
        self._fwd_end: float | None = None

    # ---------------------------------------------------------------- hooks
    def install(self) -> None:
        """Register the global optimizer hooks and wrap DDP's forward."""
        self._handles = [register_optimizer_step_pre_hook(self._pre_step),
                         register_optimizer_step_post_hook(self._post_step)]
        self._original_forward = DistributedDataParallel.forward
        DistributedDataParallel.forward = self._wrap(self._original_forward)  # type: ignore[method-assign]

    def uninstall(self) -> None:
        """Remove the hooks and restore DDP's forward. Idempotent."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._original_forward is not None:
            DistributedDataParallel.forward = self._original_forward  # type: ignore[method-assign]
            self._original_forward = None

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def forward(module: DistributedDataParallel, *args: Any, **kwargs: Any) -> Any:
            if self._depth or not torch.is_grad_enabled():
                return original(module, *args, **kwargs)
            start = time.perf_counter()
            self._depth += 1
            try:
                return original(module, *args, **kwargs)
            finally:
                self._depth -= 1
                self._fwd_end = time.perf_counter()
                self._forward += self._fwd_end - start
                self._samples += leading_dim(args, kwargs)
                self._timed = True
                self._keep(getattr(module, "process_group", None))

        return forward

    def _paces(self, optimizer: torch.optim.Optimizer) -> bool:
        """True for the optimizer whose steps count (the first one seen still alive)."""
        pacer = self._pacer() if self._pacer is not None else None
        if pacer is None:
            self._pacer = weakref.ref(optimizer)
            return True
        return pacer is optimizer

    def _pre_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._fwd_end is not None and self._paces(optimizer):
            # The last backward, with its wait for the gradient all-reduce.
            self._backward += time.perf_counter() - self._fwd_end
            self._fwd_end = None

    def _post_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._paces(optimizer):
            return
        self.step += 1
        if self._t0 is None:  # step 1 holds warm-up: windows start after it
            if dist.is_available() and dist.is_initialized():
                self._keep(dist.group.WORLD)
            self._reset()
            self._t0 = self._now()
            return
        self._steps += 1
        if self.step % self.every == 0:
            self.close_window(local=False)

    def _keep(self, group: Any) -> None:
        """Hold a process group until the script has returned (see release_groups)."""
        if group is not None and not any(group is kept for kept in self._groups):
            self._groups.append(group)

    def release_groups(self) -> None:
        """Drop the kept process groups once gloo's worker threads are idle.

        A gloo group's destructor joins its workers holding the GIL, while a worker
        freeing its last all-reduce may need the GIL (its saved thread-local state
        holds Python objects once some torch modules are loaded: importing tandem,
        torch._dynamo or DCP is enough). Freeing the DDP model, the group's last owner,
        right after its last all-reduce hung about one exit in five (torch 2.13). Kept
        until the script returned, then dropped after a sleep, the groups die idle.
        """
        if self._groups:
            time.sleep(RELEASE_PAUSE_S)
            self._groups.clear()

    # ---------------------------------------------------------------- windows
    @staticmethod
    def _now() -> float:
        if _cuda_live():
            torch.cuda.synchronize()  # once per window: the host clock catches the device
        return time.perf_counter()

    def _figures(self) -> list[float]:
        assert self._t0 is not None
        seconds = self._now() - self._t0
        peak = total = 0.0
        if _cuda_live():
            peak = float(torch.cuda.max_memory_allocated())
            total = float(torch.cuda.get_device_properties(torch.cuda.current_device())
                          .total_memory)
        return [float(self._steps), seconds, self._backward, self._forward,
                float(self._samples), float(self._process.memory_info().rss), peak, total,
                float(self._timed)]

    def _exchange(self, mine: list[float], local: bool) -> tuple[list[list[float]], list[int]]:
        """Every rank's figures (rows) and their ranks; only this rank's when local."""
        grouped = dist.is_available() and dist.is_initialized()
        if local or not self._gather or not grouped:
            return [mine], [dist.get_rank() if grouped else self.rank]
        self._keep(dist.group.WORLD)
        vector = torch.tensor(mine, dtype=torch.float64, device=gather_device())
        try:
            table = gather(vector)
        except Exception as err:  # a broken group: stop gathering, keep the script going
            log.warning("observe: the window gather failed at step %d (%s); later windows "
                        "are this rank's only", self.step, err)
            self._gather = False
            return [mine], [dist.get_rank()]
        return table.tolist(), list(range(len(table)))

    def close_window(self, local: bool) -> None:
        """End a window: gather (all ranks, unless `local`), rank 0 records it."""
        if self._t0 is None or self._steps == 0:
            return
        table, ranks = self._exchange(self._figures(), local)
        if self.recorder is not None and ranks[0] == 0:
            try:
                window = self.derive(self.step, table, ranks)
                self.recorder.window(window)
                self._log(window)
            except Exception:  # recording must never stop the observed script
                log.exception("observe: recording the window at step %d failed", self.step)
        self._reset()
        self._t0 = time.perf_counter()

    def derive(self, step: int, table: list[list[float]], ranks: list[int]) -> Window:
        """Job-wide and per-rank rows of one window from the ranks' figure vectors."""
        cols = [dict(zip(FIELDS, row, strict=True)) for row in table]
        seconds = max(c["seconds"] for c in cols)
        steps = max(c["steps"] for c in cols)
        step_time = seconds / steps
        rows: list[Row] = [(step, -1, TIME_STEP, step_time),
                           (step, -1, "steps_per_s", 1.0 / step_time if step_time > 0 else 0.0)]
        rate = 0.0
        if all(c["samples"] > 0 for c in cols) and seconds > 0:
            # A local window knows only this rank's batches: assume equal ones (DDP).
            rate = sum(c["samples"] for c in cols) * (self.world / len(cols)) / seconds
            rows.append((step, -1, SAMPLES_PER_S, rate))
            self._job["samples"] += rate * seconds
            self._job["seconds"] += seconds
        # A score needs every rank: a local window (the group gone) knows only its own.
        rows += self._per_rank(step, cols, ranks, scores=len(cols) == self.world)
        events = self.detectors.window(step, rate, 0.0) if rate > 0 else []
        return Window(step=step, loss=math.nan, samples_per_s=rate, rows=rows, events=events)

    @staticmethod
    def _per_rank(step: int, cols: list[dict[str, float]], ranks: list[int],
                  scores: bool) -> list[Row]:
        timed = all(c["timed"] for c in cols)
        rows = rank_rows(step, ranks, [c["seconds"] / c["steps"] for c in cols],
                         [c["backward"] / c["steps"] for c in cols] if timed else None,
                         [c["rss"] for c in cols], scores=scores)
        for rank, c in zip(ranks, cols, strict=True):
            if timed:
                rows += [(step, rank, TIME_FORWARD, c["forward"] / c["steps"]),
                         (step, rank, TIME_BACKWARD_SYNC, c["backward"] / c["steps"])]
            if c["cuda_total"] > 0:
                rows += [(step, rank, MEM_CUDA_PEAK, c["cuda_peak"]),
                         (step, rank, MEM_CUDA_TOTAL, c["cuda_total"])]
        return rows

    def _log(self, window: Window) -> None:
        scores = {r: v for _, r, name, v in window.rows if name == STRAGGLER_SCORE}
        step_time = next(v for _, r, n, v in window.rows if r == -1 and n == TIME_STEP)
        worst = max(scores, key=scores.__getitem__) if len(scores) > 1 else None
        slowest = "" if worst is None else f"  slowest rank {worst} ({scores[worst]:.2f})"
        log.info("observe: step %d  %.2f ms/step  %s samples/s%s", window.step,
                 step_time * 1e3,
                 f"{window.samples_per_s:,.0f}" if window.samples_per_s else "?", slowest)
        for event in window.events:
            log.warning("observe: %s", event.message)

    def summary(self) -> dict[str, Any]:
        """Steps, wall time and the job's samples/s over the recorded windows."""
        job = self._job
        return {"steps": self.step,
                "wall_time_s": time.perf_counter() - self._started,
                "samples_per_s": job["samples"] / job["seconds"] if job["seconds"] else None,
                "world_size": self.world}

    def finish(self, status: str) -> None:
        """Unhook, flush the open window locally (the group may be gone), end the run."""
        self.uninstall()
        self.close_window(local=True)
        if self.step == 0:
            log.warning("observe: no optimizer step ran in this process (rank %d); scripts "
                        "that start their own worker processes are not observed", self.rank)
        if self.recorder is not None:
            self.recorder.finish(status, self.summary())
            log.info("observe: run %s recorded in %s (%s)", self.recorder.run_id,
                     self.recorder.store_path, status)
        self.release_groups()


def _setup_logging(rank: int) -> None:
    if log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[tandem observe rank {rank}] %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    log.propagate = False


def _recorder(script: Path, args: list[str], every: int, world: int) -> Recorder | None:
    name = f"{script.stem}-observed"
    device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"
    config = {"observe": {"script": str(script), "args": args, "every": every}}
    try:
        return Recorder(store_location(), new_run_id(name), name, config,
                        {"mode": "observe", "world_size": world}, device, world)
    except Exception as err:  # an unwritable store must not stop the script
        log.warning("observe: cannot record into %s (%s); the script runs unobserved",
                    store_location(), err)
        return None


def run(script: Path, args: list[str], every: int = DEFAULT_EVERY) -> None:
    """Run `script` as __main__ with argv [script, *args], observed. Re-raises its errors."""
    rank = int(os.environ.get("RANK", "0") or 0)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    _setup_logging(rank)
    recorder = _recorder(script, args, every, world) if rank == 0 else None
    observer = StepObserver(every, rank, world, recorder)
    observer.install()
    sys.argv = [str(script), *args]
    sys.path[0] = str(script.resolve().parent)  # as `python SCRIPT` would: its own imports
    status = RunStatus.FAILED
    try:
        runpy.run_path(str(script), run_name="__main__")
        status = RunStatus.COMPLETED
    except SystemExit as exit_:
        status = RunStatus.COMPLETED if exit_.code in (None, 0) else RunStatus.FAILED
        raise
    finally:
        observer.finish(status)


def main(argv: list[str] | None = None) -> None:
    """The command line: `python -m tandem.observe SCRIPT [ARGS...]`."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        raise SystemExit(0 if argv else 2)
    script = Path(argv[0])
    if not script.is_file():
        print(f"tandem.observe: script {str(script)!r} does not exist\n{USAGE}", file=sys.stderr)
        raise SystemExit(2)
    try:
        every = observe_every()
    except ValueError as err:
        print(f"tandem.observe: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    run(script, argv[1:], every)


if __name__ == "__main__":
    main()
