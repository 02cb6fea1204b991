"""One logger run per training run (issue 24, item 3): a run stopped or SIGKILLed, then
autoresumed, shows as one W&B run (offline), one MLflow run (SQLite store), one TensorBoard
curve and one ``metrics.jsonl`` whose resume marks give ``cadence plot`` its final curve.
Each is read back with the tool's own reader."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import pytest

from cadence import Trainer
from cadence.loggers import FileLogger, InMemoryLogger
from cadence.plot import load_metrics, resume_steps
from tests.common.events import StopAt
from tests.common.models import SimpleModel, make_dataloader

pytest.importorskip("wandb")
pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")

from cadence.loggers import MLFlowLogger, TensorboardLogger, WandBLogger  # noqa: E402
from tests.loggers.test_wandb_logger import read_offline_run  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RUN = "resumed"
LOSS = "loss/train/total"
TOTAL = 8  # batches: 2 epochs of 4


def make_trainer(folder: Path, callbacks: Sequence[Any] = (),
                 extra: Sequence[Any] = ()) -> Trainer:
    """A tiny run with every logger, a checkpoint every 4 batches, autoresume on."""
    loggers = [
        FileLogger(),
        TensorboardLogger(flush_interval=1),
        MLFlowLogger(tracking_uri=f"sqlite:///{folder.parent / 'mlflow.db'}",
                     experiment_name="resume", flush_interval=0),
        WandBLogger(project="cadence-tests", dir=str(folder.parent / "wb")),
        *extra,
    ]
    return Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=4),
                   max_duration=f"{TOTAL}ba", log_interval="1ba", seed=3, progress_bar=False,
                   run_name=RUN, save_folder=str(folder), save_interval="4ba", autoresume=True,
                   loggers=loggers, callbacks=list(callbacks))


def run_killed(folder: str, kill_at: int, markers: str) -> None:
    """The body of the killed subprocess: trains, SIGKILLed at ``kill_at`` (once)."""
    from tests.common.killing import KillAt

    trainer = make_trainer(Path(folder), [KillAt(markers, batches=[kill_at])])
    trainer.fit()
    trainer.close()


def tensorboard_scalars(folder: Path, tag: str = LOSS) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder), purge_orphaned_data=True)
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def mlflow_runs(folder: Path) -> list[Any]:
    from tests.loggers.test_mlflow_logger import client as mlflow_client

    client = mlflow_client(f"sqlite:///{folder.parent / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("resume")
    return [(client, run) for run in client.search_runs([experiment.experiment_id])]


def run_id_of(attempt: Path) -> str:
    """The run id in ``offline-run-<date>_<time>-<id>``; wandb appends ``-1`` to the folder
    of an attempt that starts in the same second as the previous one."""
    match = re.match(r"offline-run-\d+_\d+-([^-]+)", attempt.name)
    assert match, attempt.name
    return match.group(1)


def wandb_attempts(folder: Path) -> list[Path]:
    """The offline run folders, oldest first (``offline-run-<time>-<id>``)."""
    return sorted((folder.parent / "wb" / "wandb").glob("offline-run-*"))


def test_stopped_and_autoresumed_run_is_one_run_in_every_logger(tmp_path: Path) -> None:
    folder = tmp_path / "save"
    first = make_trainer(folder, [StopAt(4)])
    first.fit()  # stops after batch 4 and its checkpoint
    first.close()
    memory = InMemoryLogger()
    second = make_trainer(folder, extra=[memory])
    assert second.state.timestamp.batch == 4
    second.fit()
    second.close()
    resumed = dict(zip(*memory.steps_and_values(LOSS)))
    assert sorted(resumed) == list(range(5, TOTAL + 1))

    # W&B: two offline attempts of one run id; together each step once, in order
    attempts = wandb_attempts(folder)
    assert len(attempts) == 2
    assert len({run_id_of(path) for path in attempts}) == 1
    history = [(row["_step"], row[LOSS]) for path in attempts
               for row in read_offline_run(path)["history"] if LOSS in row]
    assert [step for step, _ in history] == list(range(1, TOTAL + 1))
    assert dict(history[4:]) == pytest.approx(resumed)

    # MLflow: one run, finished, resumed at step 4, each step once
    ((client, run),) = mlflow_runs(folder)
    assert run.info.status == "FINISHED" and run.data.tags["cadence_resumed_at"] == "4"
    metric = client.get_metric_history(run.info.run_id, LOSS)
    assert [m.step for m in sorted(metric, key=lambda m: m.step)] == list(range(1, TOTAL + 1))
    assert {m.step: m.value for m in metric if m.step > 4} == pytest.approx(resumed)

    # TensorBoard: one curve
    scalars = tensorboard_scalars(folder / "tensorboard")
    assert [step for step, _ in scalars] == list(range(1, TOTAL + 1))
    assert dict(scalars[4:]) == pytest.approx(resumed)

    # metrics.jsonl: the resume mark, and the final curve once per step
    assert resume_steps(folder) == [4]
    steps, values = load_metrics(folder)[LOSS]
    assert steps == list(range(1, TOTAL + 1))
    assert dict(zip(steps[4:], values[4:])) == pytest.approx(resumed)


def test_sigkilled_and_autoresumed_run_overwrites_the_steps_trained_twice(
        tmp_path: Path) -> None:
    folder = tmp_path / "save"
    # each process its own wandb service, as on a relaunch (not this process's, whose
    # address wandb passes on in the environment)
    env = {key: value for key, value in os.environ.items() if "SERVICE" not in key}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    code = (f"from tests.loggers.test_logger_resume import run_killed; "
            f"run_killed({str(folder)!r}, 7, {str(tmp_path / 'markers')!r})")
    for expected in (-9, 0):  # killed at the end of batch 7 (checkpoint: 4), then resumed
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, timeout=240,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.returncode == expected, proc.stdout[-3000:]

    # metrics.jsonl: steps 5-7 twice, the resume mark between; the final curve once each
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    mark = lines.index({"event": "resume", "step": 4})
    written = [line["step"] for line in lines if LOSS in line]
    assert written == [1, 2, 3, 4, 5, 6, 7, 5, 6, 7, 8]
    assert [line["step"] for line in lines[mark + 1:] if LOSS in line] == [5, 6, 7, 8]
    final = load_metrics(folder)[LOSS]
    assert final[0] == list(range(1, TOTAL + 1))
    after_mark = {line["step"]: line[LOSS] for line in lines[mark + 1:] if LOSS in line}
    assert dict(zip(*final)) == {**dict(zip(*final)), **after_mark}
    assert load_metrics(folder, final=False)[LOSS][0] == written

    # TensorBoard: the killed attempt's steps 5-6 purged, one curve
    scalars = tensorboard_scalars(folder / "tensorboard")
    assert [step for step, _ in scalars] == list(range(1, TOTAL + 1))
    assert {s: v for s, v in scalars if s > 4} == pytest.approx(after_mark)

    # MLflow: one run, continued; W&B: one run id over both attempts
    ((client, run),) = mlflow_runs(folder)
    assert run.info.status == "FINISHED" and run.data.tags["cadence_resumed_at"] == "4"
    history = client.get_metric_history(run.info.run_id, LOSS)
    assert {m.step for m in history} == set(range(1, TOTAL + 1))
    attempts = wandb_attempts(folder)
    assert len(attempts) == 2 and len({run_id_of(p) for p in attempts}) == 1
