"""plan.malloc_threshold_mb reaches glibc, and steps aside where it should."""

from __future__ import annotations

import sys

import pytest

from tandem import config
from tandem.runtime import tune_host_allocator


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_threshold_is_set_on_glibc_and_skipped_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert tune_host_allocator(16.0)
    assert not tune_host_allocator(0.0)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")  # the user's own choice wins
    assert not tune_host_allocator(16.0)


def test_threshold_bounds() -> None:
    with pytest.raises(ValueError, match="glibc's limit of 32"):
        config.load(overrides={"plan.malloc_threshold_mb": "64"})
    with pytest.raises(ValueError, match="plan.malloc_threshold_mb"):
        config.load(overrides={"plan.malloc_threshold_mb": "-1"})
