"""What CI cannot test, checked on one CUDA GPU in one bounded command; one table out.

    python benchmarks/gpu_check.py --out gpu_check.json     # on a machine with a GPU
    python benchmarks/gpu_check.py --cpu                     # the CPU rehearsal

Rows: NCCL under `tandem run` and DDP through tandem's strategy (with the bf16 hook),
PhaseClock's CUDA events against wall clocks, bf16 and fp16 (GradScaler) training,
the loader's pinned side-stream prefetch (content and overlap), CUDA memory figures,
NVML utilisation, MFU against the data-sheet peak, implicit host syncs per step,
plan.compile, and the char-LM example's tokens/s with its run store read back.

Every check runs in a process of its own under a time limit, so one that fails, hangs
or takes the driver down leaves the others alone; all of them together stay within
--budget seconds (default 450). Without a CUDA device (or with --cpu) each check
rehearses on the CPU what does not need CUDA: its row says "skipped: no CUDA device"
and whether the rehearsal passed, and a failed rehearsal is a failure. The exit status
is 1 when any row failed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from _bench import child_env, table
from _gpu_common import Row, row, run_tree, skip, tail

# name -> (module, function, time limit in seconds), in the order they run: cheap first.
CHECKS: dict[str, tuple[str, str, float]] = {
    "phase_timing": ("_gpu_device", "phase_timing", 60),
    "precision": ("_gpu_device", "precision", 90),
    "prefetch": ("_gpu_device", "prefetch", 90),
    "nvml": ("_gpu_device", "nvml", 45),
    "memory": ("_gpu_runs", "memory", 90),
    "mfu": ("_gpu_runs", "mfu", 120),
    "host_syncs": ("_gpu_runs", "host_syncs", 90),
    "nccl_ddp": ("_gpu_nccl", "nccl_ddp", 150),
    "char_lm": ("_gpu_runs", "char_lm", 180),
    "compile": ("_gpu_runs", "compile_check", 240),
}
MIN_START_S = 15.0  # a check is not started with less of the budget left
REHEARSED = "no CUDA device; the CPU rehearsal passed"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the table as JSON here")
    parser.add_argument("--cpu", action="store_true",
                        help="rehearse on the CPU even when a CUDA device is present")
    parser.add_argument("--budget", type=float, default=450.0,
                        help="seconds for all checks together (default 450)")
    parser.add_argument("--only", default="",
                        help=f"comma-separated checks to run (default all: {', '.join(CHECKS)})")
    parser.add_argument("--keep", action="store_true", help="keep the work folder and logs")
    # Internal: one check in this process, or the worker `tandem run` starts.
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=float, default=60.0, help=argparse.SUPPRESS)
    return parser


def environment(device_type: str) -> dict[str, Any]:
    """What the checks ran on."""
    env: dict[str, Any] = {"device": device_type, "torch": torch.__version__,
                           "cuda": torch.version.cuda, "python": platform.python_version(),
                           "host": platform.node()}
    if device_type != "cuda":
        return env
    # Through NVML, not torch.cuda: this process must hold no CUDA context of its own
    # while the checks run (a GPU in exclusive-process mode would refuse them).
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        env.update(gpu=name.decode() if isinstance(name, bytes) else name,
                   gpu_memory_gib=round(pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30, 1))
        driver = pynvml.nvmlSystemGetDriverVersion()
        env["driver"] = driver.decode() if isinstance(driver, bytes) else driver
    except Exception as err:  # noqa: BLE001 - the nvml row says what is wrong with NVML
        env["gpu"] = f"a CUDA device (NVML: {type(err).__name__})"
    try:
        version = torch.cuda.nccl.version()
        env["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else (
            str(version))
    except Exception as err:  # noqa: BLE001 - a missing NCCL is the nccl row's business
        env["nccl"] = f"unknown ({type(err).__name__})"
    return env


def run_check(name: str, device_type: str, limit: float, work: Path) -> list[Row]:
    """Run one check in its own process, killed with all it started after `limit` s."""
    result, log = work / f"{name}.json", work / f"{name}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--device",
           device_type, "--result", str(result), "--work", str(work / name), "--limit",
           str(limit)]
    start = time.perf_counter()
    code = run_tree(cmd, timeout=limit, env=child_env({"PYTHONUNBUFFERED": "1"}), log=log)
    seconds = time.perf_counter() - start
    if result.is_file():
        rows = json.loads(result.read_text())
    else:
        why = f"ran past its limit of {limit:.0f} s (killed)" if code is None else (
            f"its process ended with status {code} before writing a result")
        rows = [row(name, "", "", False, f"{why}: ...{tail(log, 600)}")]
    for r in rows:
        r["seconds"] = round(seconds, 1)
    return rows


def run_child(ns: argparse.Namespace) -> int:
    """The child's side: run check `ns.child` on `ns.device`, write its rows as JSON."""
    module_name, function, _ = CHECKS[ns.child]
    device = torch.device("cuda", 0) if ns.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    work = Path(ns.work)
    work.mkdir(parents=True, exist_ok=True)
    try:
        check = getattr(importlib.import_module(module_name), function)
        rows = check(device, work, max(5.0, ns.limit - 10.0))
    except Exception as err:  # noqa: BLE001 - the row says what broke; the others go on
        rows = [row(ns.child, "", "", False, f"{type(err).__name__}: {err} | "
                                             f"{traceback.format_exc(limit=4)[-900:]}")]
    Path(ns.result).write_text(json.dumps(rows, default=str))
    return 0


def rehearsed(r: Row) -> Row:
    """A row measured on the CPU: a pass there is a rehearsal, not a GPU result."""
    if r["status"] == "pass":
        return {**r, "status": "skipped", "reason": REHEARSED, "rehearsal": "pass"}
    if r["status"] == "fail":
        return {**r, "reason": f"CPU rehearsal failed: {r['reason']}", "rehearsal": "fail"}
    return r


def render(rows: list[Row], env: dict[str, Any], elapsed: float) -> str:
    """The table: check, result, figure, and what was checked (or why not)."""
    extras = "".join(f", {key} {env[key]}" for key in ("driver", "nccl") if key in env)
    head = (f"GPU check on {env.get('gpu', 'CPU (rehearsal)')}: torch {env['torch']}, CUDA "
            f"{env['cuda']}{extras}, python {env['python']}; {elapsed:.0f} s")
    lines = [[r["check"], r["status"] + (f" ({r['seconds']:.0f} s)" if "seconds" in r else ""),
              r["figure"], r["what"] + (f" -- {r['reason']}" if r["reason"] else "")]
             for r in rows]
    return head + "\n\n" + table(["check", "result", "figure", "what -- why"], lines)


def main(argv: list[str] | None = None) -> int:
    """Run the checks (or, internally, one check or the worker)."""
    ns = _parser().parse_args(argv)
    if ns.worker:
        from _gpu_nccl import worker

        worker(ns.device, Path(ns.result), Path(ns.work))
        return 0
    if ns.child:
        return run_child(ns)
    names = [n.strip() for n in ns.only.split(",") if n.strip()] or list(CHECKS)
    unknown = sorted(set(names) - set(CHECKS))
    if unknown:
        raise SystemExit(f"--only: unknown check(s) {unknown}; choose from {list(CHECKS)}")
    device_type = "cuda" if torch.cuda.is_available() and not ns.cpu else "cpu"
    env = environment(device_type)
    work = Path(tempfile.mkdtemp(prefix="tandem-gpu-check-"))
    started = time.monotonic()
    rows: list[Row] = []
    for name in names:
        left = ns.budget - (time.monotonic() - started)
        if left < MIN_START_S:
            rows.append(skip(name, "", f"the time budget of {ns.budget:.0f} s was spent"))
            continue
        found = run_check(name, device_type, min(CHECKS[name][2], left - 5.0), work)
        print(f"[gpu_check] {name}: {', '.join(r['status'] for r in found)} "
              f"({found[0]['seconds']:.0f} s)", file=sys.stderr, flush=True)
        rows += found
    if device_type == "cpu":
        rows = [rehearsed(r) for r in rows]
    elapsed = time.monotonic() - started
    print(render(rows, env, elapsed))
    if ns.out:
        Path(ns.out).write_text(json.dumps({"env": env, "elapsed_s": round(elapsed, 1),
                                            "budget_s": ns.budget, "rows": rows},
                                           indent=2, default=str) + "\n")
    if ns.keep:
        print(f"work folder (logs): {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any(r["status"] == "fail" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
