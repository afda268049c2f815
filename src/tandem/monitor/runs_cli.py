"""`tandem runs`: list the run store's runs (filtered, limited) and delete them, and where
a run's folder is (its report and comparisons go there, not into the current folder)."""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tandem.monitor.catalogue import LOSS
from tandem.monitor.store import RUN_KINDS, STATUSES, RunStore
from tandem.status import RunStatus
from tandem.tables import print_fitted


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The filters, the limit and the deletion of `tandem runs`."""
    parser.add_argument("--name", default=None,
                        help="runs whose name matches this pattern (shell-style: 'mnist*')")
    parser.add_argument("--status", default=None, choices=STATUSES,
                        help="runs with this status")
    parser.add_argument("--kind", default=None, choices=[*RUN_KINDS, "all"],
                        help="who made the runs: user (the default), trial or control "
                             "(the tuner's), or all")
    parser.add_argument("--limit", type=int, default=None, help="at most this many, newest first")
    parser.add_argument("--delete", action="store_true",
                        help="delete the runs listed (store rows and run folders), after a "
                             "confirmation; needs --name, --status or --kind")
    parser.add_argument("--yes", action="store_true", help="--delete without asking")


def run_folder(run: dict[str, Any]) -> Path | None:
    """The run's folder (<run.dir>/<name>, run.dir taken from where it was launched), or
    None when the store does not say where that was."""
    directory = ((run.get("config") or {}).get("run") or {}).get("dir")
    cwd = (run.get("env") or {}).get("cwd")
    if not directory or not (cwd or Path(directory).is_absolute()):
        return None
    return (Path(cwd or "/") / Path(directory).expanduser()).resolve() / run["name"]


def output_path(store: RunStore, run: dict[str, Any], file_name: str) -> Path:
    """Where a file about `run` goes: its folder when that exists, else `reports/` beside
    the store (never the current folder)."""
    folder = run_folder(run)
    if folder is None or not folder.is_dir():
        folder = store.path.parent / "reports"
    return folder / file_name


def run(ns: argparse.Namespace, store: RunStore, console: Console,
        ask: Callable[[str], str] = input) -> int:
    """List the selected runs; with --delete, delete them once confirmed."""
    kind = None if ns.kind == "all" else (ns.kind or "user")
    chosen = store.select_runs(ns.name, ns.status, kind, ns.limit)
    # A new run's id begins with its name: the name goes first when space is short.
    print_fitted(console, _table(store, chosen, show_kind=kind is None),
                 drop=("name", "started", "world", "kind"))
    if not ns.delete:
        return 0
    if ns.name is None and ns.status is None and ns.kind is None:
        raise ValueError("--delete needs --name, --status or --kind to choose the runs "
                         "(it never deletes every run by default)")
    if ns.status != RunStatus.RUNNING:  # a live run (or one killed without a record) is kept
        chosen = [r for r in chosen if r["status"] != RunStatus.RUNNING]
    if not chosen:
        console.print("nothing to delete")
        return 0
    if not ns.yes and not _confirmed(len(chosen), ask):
        console.print("nothing deleted (pass --yes to delete without being asked)")
        return 1
    for line in delete(store, chosen):
        console.print(line, highlight=False)
    return 0


def _confirmed(count: int, ask: Callable[[str], str]) -> bool:
    try:
        answer = ask(f"delete these {count} runs: store rows and run folders? [y/N] ")
    except (EOFError, OSError, RuntimeError):  # no stdin, no one to ask: refuse
        return False
    return answer.strip().lower() in ("y", "yes")


def delete(store: RunStore, runs: Sequence[dict[str, Any]]) -> list[str]:
    """Delete `runs` from the store, and each one's folder when no run kept uses it;
    one line per run saying what went."""
    doomed = {r["run_id"] for r in runs}
    kept = {run_folder(r) for r in store.select_runs(kind=None) if r["run_id"] not in doomed}
    lines = []
    for r in runs:
        store.delete_run(r["run_id"])
        folder = run_folder(r)
        if folder is not None and folder not in kept and _is_run_folder(folder, store.path):
            shutil.rmtree(folder)
            kept.add(folder)  # gone: not deleted twice
            lines.append(f"deleted {r['run_id']} and {folder}")
        else:
            lines.append(f"deleted {r['run_id']}")
    return lines


def _is_run_folder(folder: Path, store_path: Path) -> bool:
    # Only what a run wrote (its config.toml), and never a folder holding the store.
    return (folder.is_dir() and (folder / "config.toml").is_file()
            and not store_path.resolve().is_relative_to(folder))


def _table(store: RunStore, runs: Sequence[dict[str, Any]], show_kind: bool) -> Table:
    table = Table(title=f"runs in {store.path}, newest first")
    table.add_column("run id", no_wrap=True, overflow="fold")
    columns = ["started", "name", *(["kind"] if show_kind else []), "status", "world",
               "steps", "final loss"]
    for column in columns:
        table.add_column(column)
    for r in runs:
        summary = r.get("summary") or {}
        loss = store.metrics(r["run_id"], name=LOSS, rank=-1)
        # A run stopped without a summary still shows how far it got.
        steps = summary.get("steps", loss[-1]["step"] if loss else "")
        cells = [time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started"])), r["name"],
                 *([r["kind"]] if show_kind else []), r["status"],
                 str((r.get("env") or {}).get("world_size", "")), str(steps),
                 f"{loss[-1]['value']:.4f}" if loss else ""]
        table.add_row(r["run_id"], *cells)
    return table

