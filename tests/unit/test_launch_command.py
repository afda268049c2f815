"""`tandem run` flags become the torchrun command line they stand for."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tandem.launcher.command import add_arguments, torchrun_command


def _command(tmp_path: Path, *flags: str) -> list[str]:
    script = tmp_path / "train.py"
    script.write_text("")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return torchrun_command(parser.parse_args([*flags, str(script), "--train.steps", "3"]))


def test_multi_node_flags_pass_through(tmp_path: Path) -> None:
    cmd = _command(tmp_path, "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                   "10.0.0.1:29400", "--rdzv-conf", "is_host=false", "--local-addr", "10.0.0.2")
    assert "--nnodes=2" in cmd and "--node-rank=1" in cmd and "--standalone" not in cmd
    assert "--rdzv-conf=is_host=false" in cmd and "--local-addr=10.0.0.2" in cmd
    assert cmd[-2:] == ["--train.steps", "3"]


def test_a_node_rank_is_honoured_by_a_static_rendezvous(tmp_path: Path) -> None:
    # c10d ignores --node-rank (it numbers the nodes itself): a node rank means static.
    ranked = _command(tmp_path, "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                      "10.0.0.1:29400")
    assert "--rdzv-backend=static" in ranked and "--node-rank=1" in ranked
    elastic = _command(tmp_path, "--nnodes", "1:4", "--rdzv-endpoint", "10.0.0.1:29400")
    assert "--rdzv-backend=c10d" in elastic and not any("node-rank" in a for a in elastic)
    endpoint = ("--rdzv-endpoint", "10.0.0.1:29400")
    with pytest.raises(ValueError, match="--node-rank 1: the c10d rendezvous ignores it"):
        _command(tmp_path, "--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d",
                 *endpoint)
    with pytest.raises(ValueError, match="--nnodes 1:4: --node-rank"):
        _command(tmp_path, "--nnodes", "1:4", "--node-rank", "0", *endpoint)
    with pytest.raises(ValueError, match=r"--node-rank 2: must be an integer in \[0, 1\]"):
        _command(tmp_path, "--nnodes", "2", "--node-rank", "2", *endpoint)
    with pytest.raises(ValueError, match="--rdzv-backend static needs --node-rank"):
        _command(tmp_path, "--nnodes", "2", "--rdzv-backend", "static", *endpoint)


def test_missing_plan_and_endpoint_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--plan 'nope.toml' does not exist"):
        _command(tmp_path, "--plan", "nope.toml")
    with pytest.raises(ValueError, match="--rdzv-endpoint"):
        _command(tmp_path, "--nnodes", "2")
    single = _command(tmp_path)
    # One node: torchrun's standalone rendezvous, on the loopback interface only.
    assert "--rdzv-endpoint=127.0.0.1:0" in single and "--local-addr=127.0.0.1" in single
    assert "--standalone" not in single


def test_the_command_line_works_without_the_dashboard_extra() -> None:
    """The demo installs only the `examples` extra: the command line must not need
    starlette, uvicorn or jinja2 (the dashboard's), nor import torch to launch."""
    import subprocess
    import sys

    code = ("import sys\n"
            "for name in ('starlette', 'uvicorn', 'jinja2'): sys.modules[name] = None\n"
            "from tandem.cli import _parser\n"
            "ns = _parser().parse_args(['run', '--nproc-per-node', '2', 'train.py'])\n"
            "assert ns.command == 'run'\n"
            "assert 'torch' not in sys.modules, 'the launcher imported torch'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
