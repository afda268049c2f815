"""The `tandem` command."""

from __future__ import annotations

import argparse
import sys

from tandem import launch
from tandem.config import reference


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tandem", description="Run a tandem training script on 1..N processes.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="launch a script on this node (and others) via torchrun")
    launch.add_arguments(run)
    sub.add_parser("config", help="list every config option with its default")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tandem` console script."""
    ns = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if ns.command == "run":
            launch.launch(ns)
        elif ns.command == "config":
            print(reference())
    except ValueError as err:
        print(f"tandem: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
