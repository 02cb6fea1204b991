"""A deterministic ``time.perf_counter`` for callbacks that time things."""

from __future__ import annotations

import types
from typing import Any

import pytest

from cadence.callbacks import eval_clock

__all__ = ["FakeClock", "install_fake_clock"]


class FakeClock:
    """Returns ``now``; tests advance it by hand."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def install_fake_clock(monkeypatch: pytest.MonkeyPatch, module: Any, start: float) -> FakeClock:
    """Replace ``time`` in ``module`` and in the shared eval clock with a FakeClock."""
    fake = FakeClock(start)
    for target in (module, eval_clock):
        monkeypatch.setattr(target, "time", types.SimpleNamespace(perf_counter=fake))
    return fake
