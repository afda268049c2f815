"""Run a training script with its training samples served from memory (the data control),
or resolve the settings it would run with.

`tandem tune` launches this file in place of the user's script for the data control:

    tandem run --nproc-per-node N --plan T.toml .../tandem/tune/shim.py train.py FLAGS...

and, once per session, `python shim.py --resolve train.py FLAGS...` to learn the job's
resolved settings (its recipe, --config, plan and flags) without training: `tandem.fit`
prints them as one JSON line after RESOLVED_MARK and exits.

It wraps `tandem.fit` so that the task's training set is replaced by the first
CACHED_ITEMS of its items, loaded once before training and reused in the global order
(item i is cached item i mod CACHED_ITEMS). Data loading then costs nothing: the run's
throughput bounds what any data.* change can reach. Its loss means nothing; it is never
adopted, only used as a bound.
"""

from __future__ import annotations

import dataclasses
import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

CACHED_ITEMS = int(os.environ.get("TANDEM_TUNE_CACHED_ITEMS", "256"))
RESOLVED_MARK = "tandem-resolved-config: "


class CachedData:
    """A dataset of the same length whose items are the first `size` items of `inner`."""

    def __init__(self, inner: Any, size: int) -> None:
        self.length = len(inner)
        self.items = [inner[i] for i in range(min(size, self.length))]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        return self.items[i % len(self.items)]


def _patch() -> None:
    import tandem

    real_fit = tandem.fit

    def fit(task: Any, *args: Any, **kwargs: Any) -> Any:
        factory = task.train_data
        cached = dataclasses.replace(task, train_data=lambda: CachedData(factory(),
                                                                         CACHED_ITEMS))
        return real_fit(cached, *args, **kwargs)

    tandem.fit = fit


def _patch_resolve() -> None:
    import tandem
    from tandem.config import validate
    from tandem.fit import config_from_argv

    def fit(task: Any, config: Any = None, argv: list[str] | None = None,
            defaults: dict[str, Any] | None = None) -> Any:
        resolved = validate(config) if config is not None else config_from_argv(
            sys.argv[1:] if argv is None else argv, defaults)
        sys.stdout.write(RESOLVED_MARK + json.dumps(resolved.to_dict()) + "\n")
        sys.stdout.flush()
        raise SystemExit(0)

    tandem.fit = fit


def main() -> None:
    """Run sys.argv[1] as __main__ with the rest of argv, the training set in memory
    (or, after --resolve, print the settings it would run with)."""
    resolve = len(sys.argv) > 1 and sys.argv[1] == "--resolve"
    if resolve:
        del sys.argv[1]
    if len(sys.argv) < 2:
        raise SystemExit("usage: shim.py [--resolve] SCRIPT [FLAGS...]")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = str(Path(script).resolve().parent)
    _patch_resolve() if resolve else _patch()
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
