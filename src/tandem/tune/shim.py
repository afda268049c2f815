"""Run a training script with its training samples served from memory (the data control),
or resolve the settings it would run with.

`tandem tune` launches this file in place of the user's script for the data control:

    tandem run --nproc-per-node N --plan T.toml .../tandem/tune/shim.py train.py FLAGS...

and, once per session, `python shim.py --resolve train.py FLAGS...` to learn the job's
resolved settings (its recipe, --config, plan and flags) without training: `tandem.fit`
prints them as one JSON line after RESOLVED_MARK, then what one training sample costs to
read (`sample_cost`: the dataset built and a few items read in this one process) after
DATA_MARK, and exits. The sample cost tells loader workers that hide a real loading cost
from workers for samples already in memory (`smells.workers_for_cheap_data`).

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
DATA_MARK = "tandem-resolved-data: "
SAMPLE_ITEMS = 32  # items read to time one sample, spread over the dataset
SAMPLE_READ_S = 2.0  # reading stops after this long (a slow sample is timed by then)
SAMPLE_BUILD_S = 30  # a dataset that takes longer to build is not timed


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
        cost = sample_cost(task)
        if cost is not None:
            sys.stdout.write(DATA_MARK + json.dumps(cost) + "\n")
            sys.stdout.flush()
        raise SystemExit(0)

    tandem.fit = fit


def sample_cost(task: Any) -> dict[str, Any] | None:
    """{'sample_s': seconds to read one training item, 'items': read, 'kind': the
    dataset's type}, or None when the dataset cannot be built (within SAMPLE_BUILD_S)
    or indexed."""
    import signal
    import time

    def late(*_: object) -> None:
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, late)
    signal.alarm(SAMPLE_BUILD_S)
    try:
        data = task.train_data()
        n = len(data)
        if n <= 0:
            return None
        read, started = 0, time.perf_counter()
        for k in range(min(SAMPLE_ITEMS, n)):
            data[k * n // min(SAMPLE_ITEMS, n)]
            read += 1
            if time.perf_counter() - started > SAMPLE_READ_S:
                break
        spent = time.perf_counter() - started
    except Exception:  # noqa: BLE001 - any dataset that cannot say: no figure, no smell
        return None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return {"sample_s": spent / read, "items": read, "kind": type(data).__name__}


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
