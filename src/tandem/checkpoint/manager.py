"""The CheckpointManager: what goes into a checkpoint, saving it in the background,
resuming and rolling back, each state replaced as a whole.

The run hands it named Stateful objects (`state_dict()` / `load_state_dict()`): the
model and optimizer, the strategy, the precision's loss scaler, the trainer's progress.
Each state is split into its tensors (written by DCP, resharded on load) and its plain
values (kept in the checkpoint's JSON manifest, so nothing is unpickled on load).

Saving is asynchronous by default: the step only waits while the tensors are copied to
host staging buffers (pinned on CUDA, reused across saves); a background thread writes
the shards over a process group of its own (gloo, so it never competes with the
training collectives), each rank hashes the files it wrote, and rank 0 commits the
manifest once every rank's hashes are in. One save is in flight at a time: the next
save, a rollback, the end of the run and a preemption wait for it first. A process that
dies mid-save leaves only an uncommitted temp dir; the previous checkpoint stays good.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from tandem.checkpoint import _dist, codec, layout, manifest
from tandem.checkpoint.errors import CheckpointError
from tandem.checkpoint.load import load, scan
from tandem.checkpoint.save import check_args, commit, gather_files, prepare_tmp, write_shards

log = logging.getLogger("tandem")

AfterWrite = Callable[[str, int, Path], None]  # (moment, step, directory): fault hooks


class Stateful(Protocol):
    """Anything with a state that a checkpoint keeps."""

    def state_dict(self) -> dict[str, Any]: ...  # noqa: D102

    def load_state_dict(self, state: dict[str, Any]) -> None: ...  # noqa: D102


class CheckpointManager:
    """Saves, finds and restores the run's checkpoints under `root`. All ranks."""

    def __init__(self, root: Path, states: Mapping[str, Stateful], *, keep: int,
                 asynchronous: bool = True, device: torch.device | None = None,
                 timeout_s: float = 300.0, hook: AfterWrite | None = None) -> None:
        self.root, self.states, self.keep = Path(root), dict(states), keep
        self.lineage = ""  # the run that writes here (its run id), set once it is known
        self.device = device or torch.device("cpu")
        self.hook = hook
        self.last_step = -1  # step of the last save asked for
        self.last_blocked_s = 0.0
        self._token = _dist.broadcast_from_zero(uuid.uuid4().hex[:12])
        self._group = (dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
                       if _dist.initialized() and asynchronous else None)
        self._executor = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="tandem-ckpt")
                          if asynchronous else None)
        self._pending: Future[Path] | None = None
        self._staging: dict[str, Any] | None = None
        self._staged_shapes: dict[str, list[int]] | None = None

    # ------------------------------------------------------------------ saving
    def save(self, step: int, meta: dict[str, Any]) -> float:
        """Start a checkpoint of every state at `step`; return how long the step waited.

        `meta` (JSON) is recorded beside the states (the config, the world size).
        """
        started = time.perf_counter()
        self.wait()
        tensors, plain = self._capture(self.states)
        document = {**meta, "states": plain}
        check_args(step, self.keep, document)
        shapes = manifest.tensor_shapes(tensors)
        staged = self._stage(tensors, shapes) if self._executor is not None else tensors
        tmp = prepare_tmp(self.root, step, self._token)
        self.last_step = step
        if self._executor is None:
            self._write(tmp, step, staged, shapes, document)
        else:
            self._pending = self._executor.submit(self._write, tmp, step, staged, shapes,
                                                  document)
        self.last_blocked_s = time.perf_counter() - started
        return self.last_blocked_s

    def wait(self) -> Path | None:
        """Finish the save in flight, if any; raise CheckpointError if it failed."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    def close(self) -> None:
        """Finish the save in flight and stop the background thread."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    @staticmethod
    def _capture(states: Mapping[str, Stateful]) -> tuple[dict[str, Any], dict[str, Any]]:
        tensors, plain = {}, {}
        for name, state in states.items():
            t, p = codec.split(state.state_dict(), name)
            if t is not None:
                tensors[name] = t
            plain[name] = p
        return tensors, plain

    def _stage(self, tensors: dict[str, Any], shapes: dict[str, list[int]]) -> dict[str, Any]:
        """Host copies of `tensors`, in buffers reused while the shapes stay the same."""
        # Imported here: it imports DTensor, a large part of start-up (see `load.load`).
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        cuda = self.device.type == "cuda"
        if self._staging is None or self._staged_shapes != shapes:
            self._staging = _create_cpu_state_dict(tensors, pin_memory=cuda)
            self._staged_shapes = shapes
        _copy_state_dict(tensors, self._staging, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize(self.device)
        return self._staging

    def _write(self, tmp: Path, step: int, state: dict[str, Any],
               shapes: dict[str, list[int]], document: dict[str, Any]) -> Path:
        """Shards, hashes and the commit: all ranks, on the checkpoint group."""
        try:
            files = write_shards(tmp, state, self._group)
            if self.hook is not None:
                self.hook("written", step, tmp)
        except CheckpointError as err:
            files = {"": {"error": str(err)}}
        everyone, shapes = gather_files(files, self._group, shapes)
        final = self.root / layout.step_name(step)
        outcome = ""
        if _dist.rank() == 0:
            errors = [entry["error"] for entry in everyone.values() if "error" in entry]
            try:
                if errors:
                    raise CheckpointError("; ".join(errors))
                commit(tmp, final, everyone, shapes, document, self.keep, self.lineage)
            except CheckpointError as err:
                layout.discard(tmp)
                outcome = str(err)
        outcome = self._agree(outcome)
        if outcome:
            raise CheckpointError(f"checkpoint of step {step} failed: {outcome}; the previous "
                                  "checkpoint is intact")
        if self.hook is not None:
            self.hook("committed", step, final)
        return final

    def _agree(self, outcome: str) -> str:
        if not _dist.initialized():
            return outcome
        box = [outcome]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    # ------------------------------------------------------------------ loading
    def find(self, before: int | None = None) -> tuple[Path | None, list[str]]:
        """(the newest checkpoint that verifies or None, what was wrong with newer ones)."""
        self.wait()
        found, problems = scan(self.root, before)
        return (Path(found) if found is not None else None), problems

    def restore(self, path: Path, names: list[str] | None = None) -> dict[str, Any]:
        """Replace the named states (default: all) by the checkpoint's, each as a whole;
        return the checkpoint's meta, its states' plain values decoded (tensors: None).
        All ranks."""
        names = list(self.states) if names is None else names
        tensors, _ = self._capture({n: self.states[n] for n in names})
        meta = load(path, tensors)
        saved = meta.get("states", {})
        missing = [n for n in names if n not in saved]
        if missing:
            raise CheckpointError(f"{path}: holds no state {missing}; it holds {sorted(saved)}")
        for name in names:
            self.states[name].load_state_dict(codec.join(tensors.get(name), saved[name]))
        return {**meta, "states": {name: codec.join(None, value)
                                   for name, value in saved.items()}}
