"""tandem: write a PyTorch training task once; run it on 1..N processes."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tandem.components import Component
    from tandem.config import Config
    from tandem.data.mixture import Mixture, Source
    from tandem.fit import RunResult, fit
    from tandem.losses import CrossEntropy
    from tandem.task import Task

__all__ = ["Component", "Config", "CrossEntropy", "Mixture", "RunResult", "Source", "Task",
           "fit"]
__version__ = "0.1.0"

# The public names load on first use, so that the command line (`tandem run`, `tandem
# queue`, ...) starts without importing torch: the launcher only starts processes.
_HOMES = {"Component": "tandem.components", "Config": "tandem.config",
          "CrossEntropy": "tandem.losses", "Mixture": "tandem.data.mixture",
          "RunResult": "tandem.fit", "Source": "tandem.data.mixture", "fit": "tandem.fit",
          "Task": "tandem.task"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tandem' has no attribute {name!r}")
    module = importlib.import_module(home)
    # Every name from that module, not only this one: importing `tandem.fit` bound the
    # submodule to `tandem.fit`, which must name the function (`from tandem import
    # RunResult` before `tandem.fit(task)`).
    for other, its_home in _HOMES.items():
        if its_home == home:
            globals()[other] = getattr(module, other)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(ModuleType):
    """The package, whose public name `fit` stays the function: the import system binds a
    submodule to its parent's attribute of the same name once it has loaded
    (`from tandem.fit import X` would otherwise make `tandem.fit` the module)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, ModuleType) and _HOMES.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
