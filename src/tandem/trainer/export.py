"""The trained model handed back at the end of a run."""

from __future__ import annotations

import copy

from torch import nn

from tandem.components import Chain
from tandem.parallel.strategy import Build, Strategy


def exported(strategy: Strategy, build: Build, components: Chain) -> nn.Module | None:
    """The trained weights (as the components' evaluation context shows them: their
    average under train.ema_decay) in a plain module that no process group owns, built
    with the structure the components gave the trained one (`Component.rebuilt`). All
    ranks."""
    with components.evaluating():
        model = strategy.export_model(lambda: components.rebuilt(build()))
        if components.swaps_weights and model is strategy.module:
            model = copy.deepcopy(model)  # the live module gets its own weights back
    return model
