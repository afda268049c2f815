"""The start-up guard: the first Ctrl-C leaves start-up, the same press's echo does not
interrupt the way out, a later press does, and closing it puts the handler back."""

from __future__ import annotations

import signal

import pytest

from tandem.trainer import guard
from tandem.trainer.guard import StartupInterrupt


def _press() -> None:
    signal.raise_signal(signal.SIGINT)  # runs the Python handler before it returns


def test_presses_during_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    before = signal.getsignal(signal.SIGINT)
    startup = StartupInterrupt()
    try:
        with pytest.raises(KeyboardInterrupt):
            _press()
        assert startup.received
        _press()  # the same press (relayed again): the way out goes on
        monkeypatch.setattr(guard, "SAME_PRESS_S", 0.0)
        with pytest.raises(KeyboardInterrupt):
            _press()  # a second press
    finally:
        startup.close()
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(SystemExit) as stopped:
        startup.exit(speak=False)
    assert stopped.value.code == 130
