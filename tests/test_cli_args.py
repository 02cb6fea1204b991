"""The ``cadence`` command line: arguments, exit codes, and config errors on stderr."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from cadence import cli
from cadence.registry import registry


def tiny_model(width: int = 2) -> Any:
    import torch

    return torch.nn.Linear(width, width)


def tiny_loader(batch_size: int) -> list[int]:
    return [batch_size]



GOOD = """\
max_duration: 1ba
global_train_batch_size: 4
model: {name: test_cli_model, width: 3}
train_loader: {name: test_cli_data}
"""


class RecordingTrainer:
    instances: list[RecordingTrainer] = []
    finished = False  # whether the run it resumes already reached max_duration

    def __init__(self, **kwargs: Any) -> None:
        from cadence.core import State

        self.kwargs = kwargs
        self.calls: list[str] = []
        # a Trainer's state: the run file's max_duration, at its start or (resumed) its end
        self.state = State(model=kwargs["model"], run_name="cli",
                           max_duration=kwargs["max_duration"])
        if RecordingTrainer.finished:
            self.state.timestamp = self.state.timestamp.to_next_batch(samples=4)
        RecordingTrainer.instances.append(self)

    def fit(self) -> None:
        self.calls.append("fit")

    def close(self) -> None:
        self.calls.append("close")


@pytest.fixture(autouse=True)
def fake_components(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the fakes for one test only; keep only the built-in registry modules that
    import today (they are being written concurrently)."""
    monkeypatch.setitem(registry.models._entries, "test_cli_model", tiny_model)
    monkeypatch.setitem(registry.datasets._entries, "test_cli_data", tiny_loader)
    importable = []
    for name in registry._BUILTIN_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module being written may fail in any way
            continue
        importable.append(name)
    monkeypatch.setattr(registry, "_BUILTIN_MODULES", tuple(importable))
    monkeypatch.setattr(registry, "_builtins_loaded", False)


def test_help_lists_train(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "train" in capsys.readouterr().out


def test_train_help_shows_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "RUN.yaml" in out and "key=value" in out


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "train" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["trian"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_bad_config_exits_2_with_every_problem_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD + "seed: abc\nprecision: bf16\n")
    assert cli.main(["train", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "2 problems in run config" in captured.err
    assert "seed: 'abc' (str) is not an int" in captured.err
    assert "precision: 'bf16' (str) is not one of: fp32, amp_bf16, amp_fp16." in captured.err
    assert "Traceback" not in captured.err


def test_bad_override_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    assert cli.main(["train", str(path), "model.widht=4"]) == 2
    err = capsys.readouterr().err
    assert "model.widht" in err and "Did you mean 'width'?" in err


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_train_builds_fits_and_closes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("cadence.trainer.trainer")
    module.Trainer = RecordingTrainer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cadence.trainer.trainer", module)
    RecordingTrainer.instances.clear()
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    assert cli.main(["train", str(path), "seed=3", "model.width=5"]) == 0
    (trainer,) = RecordingTrainer.instances
    assert trainer.calls == ["fit", "close"]
    assert trainer.kwargs["seed"] == 3
    assert trainer.kwargs["model"].in_features == 5
    assert trainer.kwargs["train_dataloader"] == [4]


def test_train_of_a_finished_run_closes_without_fitting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # a relaunched job whose (resumed) run already reached max_duration succeeds at once
    module = types.ModuleType("cadence.trainer.trainer")
    module.Trainer = RecordingTrainer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cadence.trainer.trainer", module)
    monkeypatch.setattr(RecordingTrainer, "finished", True)
    RecordingTrainer.instances.clear()
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    assert cli.main(["train", str(path)]) == 0
    (trainer,) = RecordingTrainer.instances
    assert trainer.calls == ["close"]
    assert "already reached max_duration 1ba; nothing to train" in capsys.readouterr().err
