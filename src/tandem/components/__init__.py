"""Run components: what a capability adds to a run, through hooks the trainer calls in
order (`tandem.components.base`). The plan's own add-ons are components too (`builtin`)."""

from __future__ import annotations

from tandem.components.base import Component, RunParts, Stateful
from tandem.components.chain import Chain

__all__ = ["Chain", "Component", "RunParts", "Stateful"]
