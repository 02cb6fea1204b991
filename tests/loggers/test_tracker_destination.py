"""What the experiment-tracker destinations share (``cadence.loggers.tracker_destination``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from cadence import State
from cadence.loggers import Logger
from cadence.loggers.tracker_destination import (
    TrackerDestination, TrackerRunState, flatten_hyperparameters, installed,
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


def test_after_load_and_fit_start_start_the_run_on_logging_ranks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = _state(tmp_path)
    tracker = _Tracker()
    tracker.init(state, Logger(state, [tracker]))
    assert tracker.starts == []  # INIT: not yet (a checkpoint may name the run to continue)
    tracker.after_load(state, Logger(state, [tracker]))
    tracker.fit_start(state, Logger(state, [tracker]))
    assert tracker.starts == ["run", "run"]
    assert tracker.import_package() is sys.modules["json"]
    late = _Tracker()  # driven without AFTER_LOAD: the first log call (its hook) starts it
    late._start_after_init()
    assert late.starts == []  # before INIT: nothing
    late.init(state, Logger(state, [late]))
    late._start_after_init()
    late._start_after_init()  # once
    assert late.starts == ["run"]
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    rank_zero = _Tracker()
    rank_zero.init(state, Logger(state, [rank_zero]))
    rank_zero.after_load(state, Logger(state, [rank_zero]))
    assert rank_zero.starts == []  # rank 1 does not log
    every_rank = _Tracker(rank_zero_only=False)
    every_rank.init(state, Logger(state, [every_rank]))
    every_rank.after_load(state, Logger(state, [every_rank]))
    assert every_rank.starts == ["run-rank1"]


def test_flatten_hyperparameters_nests_with_dots() -> None:
    flat: dict[str, Any] = flatten_hyperparameters({"optimizer": {"name": "adamw", "lr": 1e-3},
                                                   "betas": [0.9, 0.95], "x": None})
    assert flat == {"optimizer.name": "adamw", "optimizer.lr": 1e-3,
                    "betas": "[0.9, 0.95]", "x": "None"}


class _IdTracker(_Tracker):
    keeps_run_id = True

    def run_id_to_resume(self) -> str | None:
        return "id-1" if self._enabled() else None  # only the logging rank has a run


def test_run_id_is_kept_in_the_callbacks_state_and_resumed_for_the_same_run_only(
        tmp_path: Path) -> None:
    state = _state(tmp_path)
    tracker = _IdTracker()
    tracker.init(state, Logger(state, [tracker]))
    tracker.init(state, Logger(state, [tracker]))  # registered once
    (kept,) = [c for c in state.callbacks if isinstance(c, TrackerRunState)]
    saved = kept.state_dict()
    assert saved == {"logger": "_IdTracker", "run_name": "run", "run_id": "id-1"}
    assert not any(isinstance(c, TrackerRunState) for c in _plain_tracker_callbacks(tmp_path))

    resumed = _IdTracker()
    fresh = _state(tmp_path)
    resumed.init(fresh, Logger(fresh, [resumed]))
    (carrier,) = [c for c in fresh.callbacks if isinstance(c, TrackerRunState)]
    carrier.load_state_dict({**saved, "logger": "OtherLogger"})  # another destination's
    assert resumed.resume_id is None
    carrier.load_state_dict({**saved, "run_name": "another-run"})  # load_path of another run
    assert resumed.resume_id is None
    carrier.load_state_dict({**saved, "run_id": ""})  # saved before the run started
    assert resumed.resume_id is None
    carrier.load_state_dict(saved)
    assert resumed.resume_id == "id-1"


def _plain_tracker_callbacks(tmp_path: Path) -> list[Any]:
    state = _state(tmp_path)
    tracker = _Tracker()  # no run id (TensorBoard): nothing added
    tracker.init(state, Logger(state, [tracker]))
    return list(state.callbacks)


@pytest.mark.world_size(2)
def test_every_rank_keeps_rank_zeros_run_id(tmp_path: Path) -> None:
    """A sharded checkpoint may keep any rank's copy of the callback state."""
    state = _state(tmp_path)
    tracker = _IdTracker()
    logger = Logger(state, [tracker])
    tracker.init(state, logger)
    tracker.after_load(state, logger)
    tracker.fit_start(state, logger)  # shares once: no second collective
    (kept,) = [c for c in state.callbacks if isinstance(c, TrackerRunState)]
    assert kept.state_dict()["run_id"] == "id-1"
