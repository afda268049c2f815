"""The run directory: created and checked by rank 0 before any state is written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch.distributed as dist

from tandem.config import Config
from tandem.runtime import Runtime


def _check_writable(run_dir: Path) -> str | None:
    """None if `run_dir` exists (or was made) and accepts files, else what is wrong."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".probe-"):
            pass
    except OSError as err:
        return f"run directory {str(run_dir)!r} is not writable: {err.strerror or err}"
    return None


def prepare_run_dir(config: Config, name: str, runtime: Runtime) -> Path:
    """Create `<run.dir>/<name>` on rank 0, record the config, agree on errors. All ranks."""
    run_dir = Path(config.run.dir).expanduser().resolve() / name
    problem = _check_writable(run_dir) if runtime.is_main else None
    if dist.is_initialized():
        box = [problem]
        dist.broadcast_object_list(box, src=0)
        problem = box[0]
    if problem is not None:
        raise ValueError(f"run.dir: {problem}")
    if runtime.is_main:
        tmp = run_dir / ".config.toml.tmp"
        tmp.write_text(config.to_toml(), encoding="utf-8")
        os.replace(tmp, run_dir / "config.toml")
    return run_dir
