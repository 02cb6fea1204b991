"""What the experiment-tracker destinations share (``cadence.loggers.tracker_destination``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from cadence import State
from cadence.loggers import Logger
from cadence.loggers.tracker_destination import (
    TrackerDestination, flatten_hyperparameters, installed,
)
from tests.common.models import SimpleModel


class _Tracker(TrackerDestination):
    package = "json"  # always installed

    def __init__(self, rank_zero_only: bool = True) -> None:
        super().__init__(rank_zero_only)
        self.starts: list[str] = []

    def _start(self, state: State) -> None:
        if self._enabled():
            self.starts.append(self._rank_name(state.run_name))


def _state(tmp_path: Path) -> State:
    return State(model=SimpleModel(), run_name="run", save_folder=str(tmp_path))


def test_installed_without_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert installed("json") and not installed("no_such_package_xyz")
    monkeypatch.setitem(sys.modules, "json", None)  # blocked: `import json` would fail
    assert not installed("json")


def test_missing_package_is_refused_with_the_install_line() -> None:
    class Missing(_Tracker):
        package = "no_such_package_xyz"

    with pytest.raises(ImportError, match=r"Missing needs the `no_such_package_xyz` package.*"
                                          r"pip install no_such_package_xyz.*"
                                          r"cadence\[no_such_package_xyz\]"):
        Missing()
    error = Missing.missing_package()
    assert isinstance(error, ImportError) and "remove the no_such_package_xyz logger" in str(error)


def test_init_and_fit_start_start_the_run_on_logging_ranks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = _state(tmp_path)
    tracker = _Tracker()
    tracker.init(state, Logger(state, [tracker]))
    tracker.fit_start(state, Logger(state, [tracker]))
    assert tracker.starts == ["run", "run"]
    assert tracker.import_package() is sys.modules["json"]
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    rank_zero = _Tracker()
    rank_zero.init(state, Logger(state, [rank_zero]))
    assert rank_zero.starts == []  # rank 1 does not log
    every_rank = _Tracker(rank_zero_only=False)
    every_rank.init(state, Logger(state, [every_rank]))
    assert every_rank.starts == ["run-rank1"]


def test_flatten_hyperparameters_nests_with_dots() -> None:
    flat: dict[str, Any] = flatten_hyperparameters({"optimizer": {"name": "adamw", "lr": 1e-3},
                                                   "betas": [0.9, 0.95], "x": None})
    assert flat == {"optimizer.name": "adamw", "optimizer.lr": 1e-3,
                    "betas": "[0.9, 0.95]", "x": "None"}
