"""MLFlowLogger: real MLflow runs in a local SQLite store, read back with MlflowClient."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Callback, State, Trainer
from cadence.registry import registry
from cadence.loggers import InMemoryLogger, Logger, MLFlowLogger
from tests.common.models import SimpleModel, make_dataloader

pytest.importorskip("mlflow")


def client(uri: str) -> Any:
    with warnings.catch_warnings():  # SQLAlchemy 2.1's noload deprecation, inside MLflow
        warnings.filterwarnings("ignore", message="The ``noload`` loader strategy",
                                category=DeprecationWarning)
        from mlflow import MlflowClient

        return MlflowClient(uri)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite store for the module (creating one runs MLflow's migrations: seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


class FailAt(Callback):
    def __init__(self, batch: int) -> None:
        self.batch = batch

    def batch_end(self, state: State, logger: Any) -> None:
        if int(state.timestamp.batch) == self.batch:
            raise RuntimeError("deliberate failure")


def fit(tmp_path: Path, mlflow_logger: MLFlowLogger, run_name: str,
        callbacks: tuple[Callback, ...] = ()) -> InMemoryLogger:
    memory = InMemoryLogger()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=3),
                      eval_dataloader=make_dataloader(num_batches=1, seed=1),
                      max_duration="2ep", log_interval="2ba", seed=0, progress_bar=False,
                      run_name=run_name, loggers=[mlflow_logger, memory],
                      callbacks=list(callbacks),
                      hyperparameters={"optimizer": {"name": "adamw", "lr": 1e-3}})
    try:
        trainer.fit()
    finally:
        trainer.close()
    return memory


def test_runs_params_loss_history_and_status(tmp_path: Path, store: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """One store, two runs: a normal fit ends FINISHED, a failing one FAILED."""
    uri = store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # honoured when tracking_uri is not given
    ok = MLFlowLogger(experiment_name="tests", tags={"team": "cadence"}, flush_interval=0)
    memory = fit(tmp_path, ok, "good")
    ok.close()  # twice: no error, status unchanged
    failing = MLFlowLogger(experiment_name="tests")
    with pytest.raises(RuntimeError, match="deliberate"):
        fit(tmp_path, failing, "bad", callbacks=(FailAt(batch=2),))

    mlflow = client(uri)
    experiment = mlflow.get_experiment_by_name("tests")
    assert experiment.experiment_id == ok.experiment_id == failing.experiment_id
    good = mlflow.get_run(ok.run_id)
    assert good.info.run_name == "good" and good.info.status == "FINISHED"
    assert good.data.tags["cadence_run_name"] == "good" and good.data.tags["team"] == "cadence"
    params = good.data.params
    assert {k: params[k] for k in ("optimizer.name", "optimizer.lr", "rank_zero_seed")} == \
        {"optimizer.name": "adamw", "optimizer.lr": "0.001", "rank_zero_seed": "0"}
    history = mlflow.get_metric_history(ok.run_id, "loss/train/total")
    steps, losses = memory.steps_and_values("loss/train/total")
    assert sorted((m.step, m.value) for m in history) == \
        [(s, pytest.approx(v)) for s, v in zip(steps, losses)]
    assert steps == [1, 2, 4, 6]
    bad = mlflow.get_run(failing.run_id)
    assert bad.info.status == "FAILED"
    # batch 2 logged its loss before its BATCH_END raised; what was logged is kept
    assert [m.step for m in mlflow.get_metric_history(failing.run_id, "loss/train/total")] == [1, 2]


def test_default_store_is_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    state = State(model=torch.nn.Linear(1, 1), run_name="local")
    mlflow_logger = MLFlowLogger()
    logger = Logger(state, [mlflow_logger])
    logger.log_hyperparameters({"lr": torch.tensor(0.5)})
    logger.log_metrics({"x": torch.tensor(1.5), "text": "skipped"}, step=0)  # before INIT
    mlflow_logger.init(state, logger)
    logger.log_hyperparameters({"lr": 0.25})  # a param cannot change: the first value stays
    mlflow_logger.close()
    assert (tmp_path / "runs" / "mlflow.db").is_file()
    run = client(f"sqlite:///{tmp_path}/runs/mlflow.db").get_run(mlflow_logger.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"lr": "0.5"}
    assert run.data.metrics == {"x": 1.5}
    assert client(f"sqlite:///{tmp_path}/runs/mlflow.db").get_experiment(
        mlflow_logger.experiment_id).name == "from-env"


def test_rank_zero_only(tmp_path: Path, store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    state = State(model=torch.nn.Linear(1, 1), run_name="r")
    quiet = MLFlowLogger(tracking_uri=f"sqlite:///{tmp_path}/m.db")
    quiet.init(state, Logger(state, [quiet]))
    quiet.log_metrics({"x": 1.0}, step=1)
    quiet.close()
    assert quiet.run_id is None and not (tmp_path / "m.db").exists()
    uri = store
    every = MLFlowLogger(tracking_uri=uri, rank_zero_only=False)
    every.init(state, Logger(state, [every]))
    every.close()
    assert client(uri).get_run(every.run_id).info.run_name == "r-rank1"


def test_missing_mlflow_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ImportError, match="pip install mlflow"):
        MLFlowLogger()


def test_rejects_bad_flush_interval() -> None:
    with pytest.raises(ValueError, match="flush_interval"):
        MLFlowLogger(flush_interval=-1)


def test_nameable_from_yaml() -> None:
    assert registry.loggers.get("mlflow") is MLFlowLogger


class LogValues(Callback):
    """Logs ``extra/const`` (always 1.0) and ``extra/step`` (the step) every batch."""

    def batch_end(self, state: State, logger: Any) -> None:
        step = int(state.timestamp.batch)
        logger.log_metrics({"extra/const": 1.0, "extra/step": float(step), "skip/me": 2.0})


def test_composer_filters_renames_duplicates_group_and_sync(tmp_path: Path, store: str) -> None:
    mlflow_logger = MLFlowLogger(
        experiment_name="composer-args", tracking_uri=store, flush_interval=0, synchronous=True,
        log_system_metrics=False, rename_metrics={"extra/step": "renamed/step"},
        ignore_metrics=["skip/*"], ignore_hyperparameters=["optimizer.*"], run_group="sweep-1",
        log_duplicated_metric_every_n_steps=3)
    fit(tmp_path, mlflow_logger, "composer-args", callbacks=(LogValues(),))
    mlflow = client(store)
    run = mlflow.get_run(mlflow_logger.run_id)
    assert run.data.tags["run_group"] == "sweep-1"
    assert "optimizer.lr" not in run.data.params and run.data.params["rank_zero_seed"] == "0"
    assert "skip/me" not in run.data.metrics and "extra/step" not in run.data.metrics
    assert [m.step for m in mlflow.get_metric_history(run.info.run_id, "renamed/step")] == \
        [1, 2, 3, 4, 5, 6]
    # the same value is sent again only once 3 steps passed since it was last sent
    assert sorted(m.step for m in mlflow.get_metric_history(run.info.run_id, "extra/const")) == \
        [1, 4]


def test_resume_continues_the_newest_run_of_the_same_name(tmp_path: Path, store: str) -> None:
    first = MLFlowLogger(experiment_name="resume", tracking_uri=store, log_system_metrics=False)
    fit(tmp_path, first, "same-name")
    again = MLFlowLogger(experiment_name="resume", tracking_uri=store, log_system_metrics=False,
                         resume=True)
    fit(tmp_path / "2", again, "same-name")
    fresh = MLFlowLogger(experiment_name="resume", tracking_uri=store, log_system_metrics=False)
    fit(tmp_path / "3", fresh, "same-name")
    assert again.run_id == first.run_id != fresh.run_id
    assert client(store).get_run(first.run_id).info.status == "FINISHED"


def test_async_logging_is_drained_at_close_and_system_metrics_run(
        tmp_path: Path, store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow_logger = MLFlowLogger(experiment_name="async", tracking_uri=store, flush_interval=0,
                                 synchronous=False)
    fit(tmp_path, mlflow_logger, "async")  # log_system_metrics=True by default
    # drained in the logger's own store: MLflow's global default store (./mlflow.db, which
    # this test once left at the repository root) is never opened
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
    history = client(store).get_metric_history(mlflow_logger.run_id, "loss/train/total")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == [1, 2, 4, 6]
    monitor = mlflow_logger._system_monitor
    assert monitor is not None and monitor._process is None  # started, and stopped at close


def test_rejects_a_unity_catalog_prefix_without_a_schema() -> None:
    with pytest.raises(ValueError, match="catalog"):
        MLFlowLogger(model_registry_uri="databricks-uc", model_registry_prefix="main")
    with pytest.raises(ValueError, match="log_duplicated_metric_every_n_steps"):
        MLFlowLogger(log_duplicated_metric_every_n_steps=-1)
