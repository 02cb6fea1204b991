"""Bad values that used to pass validation and fail after the build (some after training)
are refused when the config is loaded: by ``cadence train`` and ``cadence launch`` before
any model, data or rank exists, each naming the key, the value and the fix.

The model here records its construction in a marker file; it is the first thing
``build_trainer`` builds, so each test proves that nothing was built (and no save folder was
made).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from cadence.cli import main as cli_main
from cadence.config.load import ConfigError, load_config


def recording_model(marker: str) -> torch.nn.Module:
    Path(marker).write_text("model built")
    from tests.common.models import SimpleModel

    return SimpleModel(in_features=2)


def tiny_loader(batch_size: int) -> list[Any]:
    return [torch.zeros(batch_size, 2)]


HERE = "tests.config.test_config_values"
RUN = """\
run_name: values
max_duration: 4ba
global_train_batch_size: 4
progress_bar: false
save_folder: {save}
model: {{name: {here}.recording_model, marker: {model_marker}}}
train_loader: {{name: {here}.tiny_loader}}
optimizer: {{name: adamw, lr: 1.0e-3, betas: [0.9, 0.95]}}
algorithms: {{gradient_clipping: {{clipping_type: norm, clipping_threshold: 1.0}}}}
callbacks: {{speed_monitor: {{window_size: 5}}}}
"""

CASES = [
    ("optimizer.lr=fast", "optimizer.lr: 'fast' (str) is not a float"),
    ("optimizer.betas=[0.9]", "optimizer.betas: [0.9] (list) has 1 item; expected a list of "
                              "exactly 2 values (a float, a float)"),
    ("save_filename='{foo}-ba{batch}'", "save_filename: '{foo}-ba{batch}' has the field {foo}, "
                                        "which is never filled in; allowed fields: {run_name}, "
                                        "{epoch}, {batch}, {rank}"),
    ("max_duration=0ba", "max_duration: '0ba' is out of range; use a duration > 0"),
    ("train_loader={name: text, path: /nonexistent/corpus.txt}",
     "train_loader.path: path='/nonexistent/corpus.txt' does not exist"),
    ("optimizer.lr=-1", "optimizer.lr: -1 is out of range; use a number >= 0"),
    ("callbacks.speed_monitor.window_size=0", "callbacks.speed_monitor: callback "
     "'speed_monitor' rejects its arguments {'window_size': 0}: SpeedMonitor window_size must "
     "be an integer >= 1, got 0"),
    ("algorithms.gradient_clipping.clipping_type=banana", "algorithms.gradient_clipping: "
     "algorithm 'gradient_clipping' rejects its arguments {'clipping_type': 'banana', "
     "'clipping_threshold': 1.0}: clipping_type 'banana' is not one of: norm, value"),
    ("load_path=/nonexistent/ep1-ba4-rank0.pt", "load_path: '/nonexistent/ep1-ba4-rank0.pt' does not "
                                          "exist; give the path of a checkpoint"),
    ("dist_timeout=0", "dist_timeout: 0.0 is out of range; use a number > 0"),
]
if not torch.cuda.is_available():
    CASES.append(("device=cuda", "device: 'cuda' is not available on this machine "
                                 "(torch.cuda.is_available() is False); use device: cpu"))


def write_run(tmp_path: Path) -> Path:
    run = tmp_path / "run.yaml"
    run.write_text(RUN.format(here=HERE, save=tmp_path / "save",
                              model_marker=tmp_path / "model-built"))
    return run


def assert_nothing_built(tmp_path: Path) -> None:
    assert not (tmp_path / "model-built").exists()  # the first thing build_trainer builds
    assert not (tmp_path / "save").exists()


@pytest.mark.parametrize("override,message", CASES, ids=[c[0] for c in CASES])
def test_cadence_train_refuses_a_bad_value_before_building(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, message: str
) -> None:
    start = time.monotonic()
    assert cli_main(["train", str(write_run(tmp_path)), override]) == 2
    err = capsys.readouterr().err
    assert "1 problem in run config" in err
    assert message in err, err
    assert f"(set by override {override!r})" in err
    assert_nothing_built(tmp_path)
    assert time.monotonic() - start < 10


def test_the_good_run_builds_so_the_markers_can_tell(tmp_path: Path) -> None:
    """The control: the same run without a bad value loads and builds its model and data."""
    from cadence.config.build import build_trainer

    trainer = build_trainer(load_config(write_run(tmp_path), ["save_folder=null"]))
    trainer.close()
    assert (tmp_path / "model-built").read_text() == "model built"


@pytest.mark.parametrize("override", ["optimizer.lr=-1", "max_duration=0ba"])
def test_cadence_launch_refuses_a_bad_value_before_any_rank_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str
) -> None:
    start = time.monotonic()
    assert cli_main(["launch", "-n", "2", str(write_run(tmp_path)), override]) == 2
    captured = capsys.readouterr()
    assert "cadence launch: 1 problem in run config" in captured.err
    assert "Starting elastic_operator" not in captured.out + captured.err
    assert_nothing_built(tmp_path)
    assert time.monotonic() - start < 10


def test_cadence_launch_checks_the_batch_size_over_n_times_nnodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(write_run(tmp_path))
    assert cli_main(["launch", "-n", "3", run]) == 2
    err = capsys.readouterr().err
    assert ("global_train_batch_size: 4 does not divide evenly over 3 ranks; use a multiple of "
            "3 (e.g. 3 or 6), or another number of ranks.") in err
    assert cli_main(["launch", "-n", "2", "--nnodes", "3", "--master_port", "29999", run]) == 2
    assert "4 does not divide evenly over 6 ranks" in capsys.readouterr().err
    assert_nothing_built(tmp_path)


def test_cadence_train_checks_the_batch_size_over_world_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")  # as torchrun sets it; no process group is made
    assert cli_main(["train", str(write_run(tmp_path))]) == 2
    assert "global_train_batch_size: 4 does not divide evenly over 3 ranks" in (
        capsys.readouterr().err)
    assert_nothing_built(tmp_path)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write_run(tmp_path), ["optimizer.lr=-1", "max_duration=0ba",
                                          "callbacks.speed_monitor.window_size=0"],
                    world_size=3)
    assert [p.key for p in info.value.problems] == [
        "max_duration", "optimizer.lr", "callbacks.speed_monitor", "global_train_batch_size"]
