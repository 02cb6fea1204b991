"""``Generate`` reaches every destination: ``metrics.jsonl`` (FileLogger), a TensorBoard event
file read back with TensorBoard's own reader, the console, and W&B's table; and it runs on two
gloo ranks under FSDP2 (``synced_gpus``)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Trainer, dist
from cadence.callbacks import Generate
from cadence.loggers import ConsoleLogger, FileLogger, InMemoryLogger, TensorboardLogger
from cadence.loggers.tensorboard_logger import markdown_table
from tests.callbacks.test_generate import PROMPTS, _model


def _loader(batch_size: int = 4) -> DataLoader:
    ids = torch.randint(0, 50257, (8, 16), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    return DataLoader(data, batch_size=batch_size,
                      sampler=dist.get_sampler(data, shuffle=False, drop_last=True))


def test_generations_reach_the_file_tensorboard_and_console(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    memory, console = InMemoryLogger(), io.StringIO()
    board = tmp_path / "tb"
    trainer = Trainer(
        model=_model(), train_dataloader=_loader(), max_duration="3ba", seed=0,
        callbacks=[Generate(PROMPTS, interval="2ba", max_new_tokens=3, do_sample=False)],
        loggers=[memory, FileLogger(folder=str(tmp_path)), TensorboardLogger(log_dir=str(board)),
                 ConsoleLogger(stream=console)],
        progress_bar=False, run_name="gen")
    trainer.fit()
    trainer.close()
    final = json.loads(memory.tables["generations"])["data"]  # the last table (step 3)
    assert [row[0] for row in final] == PROMPTS

    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    tables = [line for line in lines if line.get("table") == "generations"]
    assert [t["step"] for t in tables] == [2, 3]
    assert tables[-1]["columns"] == ["prompt", "generation"] and tables[-1]["data"] == final

    events = EventAccumulator(str(board), size_guidance={"tensors": 0})
    events.Reload()
    texts = events.Tensors("generations/text_summary")
    assert [t.step for t in texts] == [2, 3]
    written = texts[-1].tensor_proto.string_val[0].decode()
    assert written == markdown_table(["prompt", "generation"], final)

    shown = console.getvalue()
    assert "[table] generations (step 3):" in shown
    for prompt, generation in final:
        assert f"prompt: {prompt} | generation: {generation}" in shown


def test_markdown_table_escapes_cells_and_checks_row_length() -> None:
    assert markdown_table(["a", "b"], [["x|y", "one\ntwo"]]) == \
        "| a | b |\n|---|---|\n| x\\|y | one<br>two |"
    with pytest.raises(ValueError, match="row 0 has 1 values for 2 columns"):
        markdown_table(["a", "b"], [["x"]])


def test_generations_reach_wandb_as_a_table(tmp_path: Path, monkeypatch) -> None:
    wandb = pytest.importorskip("wandb")
    from cadence.loggers import WandBLogger

    logged: list[dict] = []
    original = wandb.sdk.wandb_run.Run.log

    def spy(self, data, *args, **kwargs):
        logged.append(dict(data))
        return original(self, data, *args, **kwargs)

    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log", spy)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    trainer = Trainer(
        model=_model(), train_dataloader=_loader(), max_duration="1ba", seed=0,
        callbacks=[Generate(PROMPTS, interval="1ba", max_new_tokens=2, do_sample=False)],
        loggers=[WandBLogger(project="gen", log_artifacts=False)], progress_bar=False)
    trainer.fit()
    trainer.close()
    tables = [entry["generations"] for entry in logged if "generations" in entry]
    assert len(tables) == 1 and isinstance(tables[0], wandb.Table)
    assert tables[0].columns == ["prompt", "generation"]
    assert [row[0] for row in tables[0].data] == PROMPTS


def _fsdp_generate(folder: str) -> None:
    memory = InMemoryLogger()
    model = _model()
    trainer = Trainer(
        model=model, train_dataloader=_loader(batch_size=2), max_duration="1ba", seed=0,
        callbacks=[Generate(PROMPTS, interval="1ba", max_new_tokens=3, do_sample=False)],
        loggers=[memory], progress_bar=False, parallelism_config={"fsdp": {}})
    trainer.fit()
    if dist.get_global_rank() == 0:
        Path(folder, "table.json").write_text(memory.tables["generations"])
    else:
        assert "generations" not in memory.tables  # rank zero logs, every rank generates
    trainer.close()


@pytest.mark.slow
def test_generate_under_fsdp2_on_two_ranks_matches_one_process(tmp_path: Path) -> None:
    from tests.common.distributed import run_in_processes

    run_in_processes(2, __file__, "_fsdp_generate", {"folder": str(tmp_path)})
    two = json.loads((tmp_path / "table.json").read_text())
    memory = InMemoryLogger()
    data = _loader()  # one process: the same 4 samples as the two ranks' 2 + 2
    trainer = Trainer(
        model=_model(), train_dataloader=data, max_duration="1ba", seed=0,
        callbacks=[Generate(PROMPTS, interval="1ba", max_new_tokens=3, do_sample=False)],
        loggers=[memory], progress_bar=False)
    trainer.fit()
    one = json.loads(memory.tables["generations"])
    assert two["data"] == one["data"]


def test_generations_reach_mlflow_and_the_progress_bar(tmp_path: Path, monkeypatch) -> None:
    """MLflow: the rows of every interval in the run's ``generations.json`` artifact, read back
    with ``MlflowClient`` (with a ``step`` column); the progress bar: the table's lines above
    the bars."""
    pytest.importorskip("mlflow")
    from cadence.loggers import MLFlowLogger, ProgressBarLogger
    from tests.loggers.test_mlflow_logger import client

    monkeypatch.chdir(tmp_path)  # a SQLite store keeps its artifacts in ./mlruns
    store = f"sqlite:///{tmp_path}/mlflow.db"
    bar_stream = io.StringIO()
    mlflow_logger = MLFlowLogger(experiment_name="gen", tracking_uri=store, flush_interval=0,
                                 log_system_metrics=False)
    memory = InMemoryLogger()
    trainer = Trainer(
        model=_model(), train_dataloader=_loader(), max_duration="3ba", seed=0,
        callbacks=[Generate(PROMPTS, interval="2ba", max_new_tokens=3, do_sample=False)],
        loggers=[memory, mlflow_logger, ProgressBarLogger(stream=bar_stream)],
        progress_bar=False, run_name="gen-mlflow")
    trainer.fit()
    trainer.close()
    final = json.loads(memory.tables["generations"])["data"]
    written = client(store).download_artifacts(mlflow_logger.run_id, "generations.json",
                                               str(tmp_path))
    table = json.loads(Path(written).read_text())  # MLflow's table: columns, data
    assert table["columns"] == ["step", "prompt", "generation"]
    assert [row[0] for row in table["data"]] == [2] * len(PROMPTS) + [3] * len(PROMPTS)
    assert [row[1:] for row in table["data"] if row[0] == 3] == final
    shown = bar_stream.getvalue()
    assert "[table] generations (step 3):" in shown
    assert f"prompt: {final[0][0]} | generation: {final[0][1]}" in shown
