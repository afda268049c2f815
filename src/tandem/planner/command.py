"""`tandem plan SCRIPT --global-batch B --machine M`: the feasible layouts, best first,
and why each other one does not fit."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from tandem.planner.layouts import OPTIMIZER_STATES, Setting, plan
from tandem.planner.machine import parse_machine

PROFILE_SAMPLES = 2


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("script", help="a training script that defines a tandem.Task at module "
                                   "level (its main guard is not run)")
    ap.add_argument("--global-batch", type=int, required=True, help="samples per step")
    ap.add_argument("--machine", default="cpu", help="NxKIND (e.g. 8xH100-80GB, "
                    "64xA100-40GB) or cpu (this host, one process per core)")
    ap.add_argument("--task", default=None, help="the Task's name in the script, when it "
                    "defines several")
    ap.add_argument("--efficiency", type=float, default=0.4,
                    help="achieved share of the device's peak FLOP/s (default 0.4)")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default=None,
                    help="activations' precision (default: bf16 on GPUs, fp32 on cpu)")
    ap.add_argument("--top", type=int, default=12, help="layouts to list (default 12)")


def load_task(script: str, name: str | None) -> object:
    """The tandem.Task the script defines at module level (by `name` when it has several)."""
    from tandem.task import module_task

    return module_task(script, name, "tandem plan")


def model_profile(task: object):  # noqa: ANN201 - a ModelProfile
    """The task's model profiled on the meta device on its first samples."""
    from torch.utils.data import default_collate

    from tandem.planner.profile import profile
    from tandem.trainer.forward import forward_loss
    from tandem.trainer.preflight import first_batch

    dataset = task.train_data()
    batch = first_batch(dataset, list(range(PROFILE_SAMPLES)), task.collate or default_collate)
    return profile(task.model, batch, PROFILE_SAMPLES,
                   lambda model, b: forward_loss(task, model, b),
                   dict(task.tensor_parallel or {}))


def optimizer_profile(task: object) -> tuple[int, tuple[tuple[int, int], ...], int]:
    """The task's optimizer as the planner prices it: tensors of state per parameter (2
    when not known), the matrices it orthogonalises whole each step (Muon's groups; rows
    by the rest) and its Newton-Schulz iterations."""
    import torch

    with torch.device("meta"):
        params = list(task.model().parameters())
    try:
        optimizer = task.optimizer(params)
    except Exception:  # noqa: BLE001 - an optimizer that will not build on meta: assume Adam
        return 2, (), 5
    kind = type(optimizer).__name__
    groups = [g for g in optimizer.param_groups if g.get("muon")]
    shapes = tuple((p.shape[0], p[0].numel()) for g in groups for p in g["params"])
    steps = groups[0].get("ns_steps", 5) if groups else 5
    return OPTIMIZER_STATES.get(kind, 2), shapes, steps


def main(ns: argparse.Namespace) -> int:
    machine = parse_machine(ns.machine)
    task = load_task(ns.script, ns.task)
    prof = model_profile(task)
    bf16 = (ns.precision or ("fp32" if ns.machine == "cpu" else "bf16")) == "bf16"
    states, orthogonalised, ns_steps = optimizer_profile(task)
    setting = Setting(ns.global_batch, states, bf16, ns.efficiency, orthogonalised, ns_steps)
    estimates = plan(prof, machine, setting)
    console = Console()
    console.print(f"{ns.script}: {prof.params / 1e6:,.1f} M parameters, "
                  f"{3 * prof.flops / 1e9:,.2f} GFLOP per sample (forward + backward); "
                  f"{machine.name}: {machine.devices} devices of "
                  f"{machine.memory / 2**30:,.0f} GiB in {machine.nodes} node(s)")
    table = Table("layout", "micro", "recompute", "GiB/device", "step s", "samples/s", "fits")
    for e in estimates[:ns.top]:
        lay = e.layout
        table.add_row(lay.describe(), str(lay.micro), "yes" if lay.recompute else "no",
                      f"{e.total_memory / 2**30:,.2f}" if e.memory else "-",
                      f"{e.step_s:.3g}" if e.fits else "-",
                      f"{e.samples_per_s:,.1f}" if e.fits else "-",
                      "yes" if e.fits else f"no: {e.why}")
    console.print(table)
    if not any(e.fits for e in estimates):
        console.print("no layout fits: more devices, a smaller global batch or a smaller model")
        return 1
    return 0
