"""FLOPs of a step (counted once) and the peak they are compared with (MFU)."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import platform
import re
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode, _FlopCounterMode

try:
    import fcntl
except ImportError:  # not POSIX: the cache's writes are then not serialised
    fcntl = None  # type: ignore[assignment]

# Dense peak FLOP/s per device from vendor data sheets: (name pattern, the device's
# bf16/fp16 tensor peak, fp32 without TF32, fp32 matmuls in TF32). The patterns are tried
# in order and match whole words: the more specific card first (H100 PCIe before H100,
# L40S before L40 before L4).
_GPU_PEAKS: tuple[tuple[str, float, float, float], ...] = (
    (r"H200 NVL", 836e12, 60e12, 418e12),
    (r"H200", 989e12, 67e12, 494e12),
    (r"H100 (PCIe|NVL)", 756e12, 51e12, 378e12),
    (r"H100", 989e12, 67e12, 494e12),
    (r"A100", 312e12, 19.5e12, 156e12),
    (r"L40S", 362e12, 91.6e12, 183e12),
    (r"L40", 181e12, 90.5e12, 90.5e12),
    (r"L4", 121e12, 30.3e12, 60e12),
)


def count_flops(run: Callable[[], None]) -> int:
    """FLOPs that torch's counter sees while `run` executes (matmuls, convolutions).

    Only the dispatch mode is entered, not FlopCounterMode's module tracker: the total
    needs no per-module split, and the tracker's gradient hooks fail inside
    `torch.autograd.grad`, which zero-bubble pipeline schedules call for their split
    backward."""
    counter = FlopCounterMode(display=False)
    with _FlopCounterMode(counter):
        run()
    return int(counter.get_total_flops())


def kept_flops(signature: str | None) -> int | None:
    """The FLOP count kept for `signature` (`step_signature`) by an earlier run, if any."""
    if signature is None:
        return None
    kept = _read_cache(FLOPS_FILE).get(signature)
    return kept if isinstance(kept, int) and kept >= 0 else None


def keep_flops(signature: str | None, flops: int) -> None:
    """Keep a step's FLOP count for later runs of the same step."""
    if signature is not None:
        _keep(FLOPS_FILE, signature, flops)


def step_signature(model: torch.nn.Module, batch: object, code: Iterable[object],
                   setting: str) -> str | None:
    """What a step's FLOP count depends on, hashed: the module tree with its parameters'
    shapes and dtypes, the batch's structure, shapes and dtypes, `setting` (precision,
    plan), torch's version, and the files that define the model's classes and the
    callables in `code` (path, size, modification time: an edited file counts again).
    None where any of it cannot be read: the caller then counts."""
    try:
        parts = [f"torch={torch.__version__}", setting, repr(model)]
        parts += [f"{n}:{tuple(q.shape)}:{q.dtype}" for n, q in model.named_parameters()]
        parts.append(_structure(batch))
        defined = {type(m) for m in model.modules()}
        for c in code:
            while isinstance(c, functools.partial):  # what it calls, and with what
                parts.append(f"partial{c.args!r}{sorted(c.keywords.items())!r}"[:500])
                c = c.func
            if c is not None:
                defined.add(c if inspect.isclass(c) or inspect.isroutine(c) else type(c))
        for obj in sorted(defined, key=lambda o: f"{o.__module__}.{o.__qualname__}"):
            path = inspect.getsourcefile(obj)
            if path is None:
                return None
            st = os.stat(path)
            parts.append(f"{obj.__module__}.{obj.__qualname__}@{path}:{st.st_size}:"
                         f"{st.st_mtime_ns}")
    except (TypeError, OSError, AttributeError):
        return None
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _structure(batch: object) -> str:
    if isinstance(batch, torch.Tensor):
        return f"T{tuple(batch.shape)}{batch.dtype}"
    if isinstance(batch, (list, tuple)):
        return f"{type(batch).__name__}[" + ",".join(_structure(b) for b in batch) + "]"
    if isinstance(batch, dict):
        return "{" + ",".join(f"{k!r}:{_structure(v)}" for k, v in sorted(
            batch.items(), key=lambda kv: repr(kv[0]))) + "}"
    return f"{type(batch).__name__}:{batch!r}"[:200]


def peak_flops(device: torch.device, precision: str) -> tuple[float, str]:
    """(peak FLOP/s, how it was obtained): a data-sheet figure or a measured matmul rate."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        tf32 = torch.backends.cuda.matmul.allow_tf32
        for pattern, half, fp32, tf32_peak in _GPU_PEAKS:
            if re.search(rf"\b{pattern}\b", name):
                peak = half if precision in ("bf16", "fp16") else (tf32_peak if tf32 else fp32)
                kind = precision if precision != "fp32" else ("tf32" if tf32 else "fp32")
                return peak, f"data sheet ({name}, {kind})"
    key = _machine_key(device, precision)
    cached = _read_cache(PEAKS_FILE).get(key)
    if isinstance(cached, (int, float)) and cached > 0:
        return float(cached), f"measured matmul ({device.type}, {precision}, cached)"
    peak = measure_matmul(device, precision)
    _keep(PEAKS_FILE, key, peak, larger=True)
    return peak, f"measured matmul ({device.type}, {precision})"


# A measured peak is the machine's, not the run's: it is measured once per machine, device,
# precision, thread count and torch version, and kept in this file (TANDEM_CACHE_DIR, else
# $XDG_CACHE_HOME/tandem, else ~/.cache/tandem). A later run reads it instead of spending
# 0.1 s of its own time on the probe.
PEAKS_FILE = "peaks.json"
# A step's FLOP count is kept too, under its `step_signature` (counting them again was
# most of a short run's calibration).
FLOPS_FILE = "flops.json"


def cache_dir() -> Path:
    """Where tandem keeps what it measured about this machine."""
    if os.environ.get("TANDEM_CACHE_DIR"):
        return Path(os.environ["TANDEM_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tandem"


def _machine_key(device: torch.device, precision: str) -> str:
    if device.type == "cuda":
        what = torch.cuda.get_device_name(device)
    else:
        what = _cpu_model()
    return "|".join([platform.node(), device.type, what, precision,
                     f"threads={torch.get_num_threads()}", f"torch={torch.__version__}"])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _read_cache(name: str) -> dict[str, object]:
    try:
        data = json.loads((cache_dir() / name).read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: measure again (and rewrite it)
    return data if isinstance(data, dict) else {}


def _keep(name: str, key: str, value: float, larger: bool = False) -> None:
    """Keep `value` under `key` in the cache file `name` (with `larger`: the larger of it
    and what is kept, for a peak: a probe slowed by a neighbour measures low, never high);
    atomic, and silent where nothing can be written."""
    try:
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f".{name}.lock", "a") as lock:
            if fcntl is not None:  # runs that start together must not drop each other's
                fcntl.flock(lock, fcntl.LOCK_EX)
            data = _read_cache(name)
            old = data.get(key)
            data[key] = (max(value, old) if larger and isinstance(old, (int, float)) else value)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}-")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=1, sort_keys=True)
                os.replace(tmp, folder / name)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    except OSError:
        pass


def measure_matmul(device: torch.device, precision: str, size: int = 512,
                   seconds: float = 0.1) -> float:
    """Best sustained FLOP/s of square matmuls on this device (a short calibration). On a
    CPU under bf16 or fp16 autocast, the faster of that dtype and fp32: half-precision
    matmuls are faster than fp32 on CPUs with AVX-512 BF16 or AMX, slower without."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    if device.type == "cpu" and dtype != torch.float32:
        half = _matmul_rate(device, dtype, size, seconds / 2)
        return max(half, _matmul_rate(device, torch.float32, size, seconds / 2))
    if device.type == "cuda":
        size = 4096
    return _matmul_rate(device, dtype, size, seconds)


def _matmul_rate(device: torch.device, dtype: torch.dtype, size: int, seconds: float) -> float:
    """Best FLOP/s of 4 back-to-back size x size matmuls over `seconds`."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or best == 0.0:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(4):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = max(best, 4 * 2 * size**3 / (time.perf_counter() - start))
    return best
