"""tandem: write a PyTorch training task once; run it on 1..N processes."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tandem.config import Config
    from tandem.fit import RunResult, fit
    from tandem.losses import CrossEntropy
    from tandem.task import Task

__all__ = ["Config", "CrossEntropy", "RunResult", "Task", "fit"]
__version__ = "0.1.0"

# The public names load on first use, so that the command line (`tandem run`, `tandem
# queue`, ...) starts without importing torch: the launcher only starts processes.
_HOMES = {"Config": "tandem.config", "CrossEntropy": "tandem.losses",
          "RunResult": "tandem.fit", "fit": "tandem.fit", "Task": "tandem.task"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tandem' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
