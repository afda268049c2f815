"""Stop a process and everything it started, however it was left (running or stopped)."""

from __future__ import annotations

import subprocess

import psutil


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL `proc` and all its descendants (found before any dies), then wait for them."""
    try:
        root = psutil.Process(proc.pid)
        tree = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        tree = []
    for member in tree:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(tree, timeout=10)
    proc.wait(timeout=10)
