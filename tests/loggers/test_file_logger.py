from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from cadence.core import State, Time
from cadence.loggers import FileLogger, Logger


def make_state(run_name: str = "my-run") -> State:
    model = torch.nn.Linear(2, 2)
    return State(model=model, optimizers=[torch.optim.SGD(model.parameters(), lr=0.1)],
                 max_duration=Time(2, "ep"), run_name=run_name, dataloader_len=4)


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_writes_one_json_object_per_call(tmp_path: Path) -> None:
    state = make_state()
    file_logger = FileLogger(folder=str(tmp_path))
    logger = Logger(state, [file_logger])
    file_logger.init(state, logger)
    assert not (tmp_path / "metrics.jsonl").exists()  # opened lazily
    for _ in range(3):
        state.timestamp = state.timestamp.to_next_batch(samples=8, tokens=512)
        logger.log_metrics({"loss/train/total": torch.tensor(5.0 - int(state.timestamp.batch))})
        logger.log_metrics({"lr-SGD/group0": 0.1}, step=state.timestamp.batch)
        file_logger.batch_end(state, logger)
    logger.log_metrics({"metrics/eval/LanguagePerplexity": torch.tensor(12.5)})
    file_logger.eval_end(state, logger)
    records = read_lines(tmp_path / "metrics.jsonl")
    assert records[0] == {"step": 1, "loss/train/total": 4.0}
    assert records[1] == {"step": 1, "lr-SGD/group0": 0.1}
    assert [r["step"] for r in records] == [1, 1, 2, 2, 3, 3, 3]
    assert records[-1] == {"step": 3, "metrics/eval/LanguagePerplexity": 12.5}
    file_logger.close()
    file_logger.close()  # idempotent


def test_non_finite_values_are_valid_json_strings(tmp_path: Path) -> None:
    state = make_state()
    file_logger = FileLogger(folder=str(tmp_path))
    file_logger.fit_start(state, None)
    file_logger.log_metrics({"a": float("nan"), "b": torch.tensor(float("inf")),
                             "c": -math.inf, "d": torch.tensor([1.0, 2.0])}, step=0)
    file_logger.close()
    text = (tmp_path / "metrics.jsonl").read_text()
    record = json.loads(text, parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c}"))
    assert record == {"step": 0, "a": "nan", "b": "inf", "c": "-inf", "d": [1.0, 2.0]}
    assert math.isnan(float(record["a"]))


def test_hparams_file_merged_and_written_once_folder_known(tmp_path: Path) -> None:
    state = make_state()
    file_logger = FileLogger(folder=str(tmp_path / "{run_name}"))
    # Logged before INIT (the run name is not known yet): written at init.
    file_logger.log_hyperparameters({"optimizer": {"lr": 0.1}, "seed": 17})
    assert not (tmp_path / "my-run" / "hparams.json").exists()
    file_logger.init(state, None)
    assert json.loads((tmp_path / "my-run" / "hparams.json").read_text()) == {
        "optimizer": {"lr": 0.1}, "seed": 17}
    file_logger.log_hyperparameters({"precision": "fp32", "beta": torch.tensor(0.5)})
    assert json.loads((tmp_path / "my-run" / "hparams.json").read_text()) == {
        "optimizer": {"lr": 0.1}, "seed": 17, "precision": "fp32", "beta": 0.5}
    assert file_logger.hparams_path == tmp_path / "my-run" / "hparams.json"
    file_logger.close()


def test_default_folder_is_runs_run_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    state = make_state("exp1")
    file_logger = FileLogger()
    file_logger.log_metrics({"x": 1}, step=0)  # before the run name is known: buffered
    file_logger.fit_start(state, None)
    file_logger.log_metrics({"x": 2}, step=1)
    file_logger.fit_end(state, None)
    assert file_logger.path == Path("runs/exp1/metrics.jsonl")
    assert read_lines(tmp_path / "runs" / "exp1" / "metrics.jsonl") == [
        {"step": 0, "x": 1}, {"step": 1, "x": 2}]
    file_logger.close()


def test_close_without_events_still_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    file_logger = FileLogger()
    file_logger.log_metrics({"x": 1}, step=3)
    file_logger.close()
    file_logger.close()
    assert read_lines(tmp_path / "runs" / "run" / "metrics.jsonl") == [{"step": 3, "x": 1}]


def test_appends_across_instances(tmp_path: Path) -> None:
    state = make_state()
    for step in range(2):
        file_logger = FileLogger(folder=str(tmp_path))
        file_logger.init(state, None)
        file_logger.log_metrics({"x": step}, step=step)
        file_logger.close()
    assert [r["x"] for r in read_lines(tmp_path / "metrics.jsonl")] == [0, 1]


def test_rank_zero_only_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    state = make_state()
    file_logger = FileLogger(folder=str(tmp_path))
    file_logger.init(state, None)
    file_logger.log_metrics({"x": 1}, step=0)
    file_logger.log_hyperparameters({"a": 1})
    file_logger.close()
    assert list(tmp_path.iterdir()) == []


def test_log_all_ranks_formats_rank_in_filename(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    state = make_state()
    file_logger = FileLogger(folder=str(tmp_path), log_all_ranks=True)
    file_logger.init(state, None)
    file_logger.log_metrics({"x": 1}, step=0)
    file_logger.close()
    assert read_lines(tmp_path / "metrics_rank1.jsonl") == [{"step": 0, "x": 1}]

    custom = FileLogger(folder=str(tmp_path), filename="{run_name}-r{rank}.jsonl",
                        log_all_ranks=True)
    custom.init(state, None)
    custom.log_metrics({"y": 2}, step=5)
    custom.close()
    assert read_lines(tmp_path / "my-run-r1.jsonl") == [{"step": 5, "y": 2}]


def test_log_all_ranks_needs_rank_placeholder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\{rank\}"):
        FileLogger(folder=str(tmp_path), filename="metrics.jsonl", log_all_ranks=True)
    FileLogger(folder=str(tmp_path / "rank{rank}"), filename="metrics.jsonl", log_all_ranks=True)


def test_unknown_placeholder_names_allowed_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="run_name"):
        FileLogger(folder=str(tmp_path), filename="{epoch}.jsonl")


def test_composer_signature_and_defaults() -> None:
    import inspect

    params = inspect.signature(FileLogger).parameters
    assert list(params)[:2] == ["filename", "remote_file_name"]
    for name in ("capture_stdout", "capture_stderr", "buffer_size", "log_traces", "log_level",
                 "log_interval", "flush_interval", "overwrite"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    assert params["buffer_size"].default == 1 and params["flush_interval"].default == 100
    assert params["log_interval"].default == 1 and params["overwrite"].default is False
    with pytest.raises(ValueError, match="log levels"):
        FileLogger(log_level="epoch")
    with pytest.raises(ValueError, match="flush_interval"):
        FileLogger(flush_interval=0)


def test_composer_style_filename_is_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    state = make_state("exp2")
    file_logger = FileLogger("{run_name}/logs-rank{rank}.jsonl")
    file_logger.init(state, None)
    file_logger.log_metrics({"x": 1}, step=0)
    file_logger.log_hyperparameters({"seed": 3})
    assert file_logger.filename == str(Path("exp2/logs-rank0.jsonl"))
    assert file_logger.remote_file_name == "exp2/logs-rank0.jsonl"
    file_logger.close()
    assert read_lines(tmp_path / "exp2" / "logs-rank0.jsonl") == [{"step": 0, "x": 1}]
    assert json.loads((tmp_path / "exp2" / "hparams.json").read_text()) == {"seed": 3}


def test_log_interval_overwrite_and_table(tmp_path: Path) -> None:
    state = make_state()
    (tmp_path / "metrics.jsonl").write_text('{"step": 99}\n')
    file_logger = FileLogger(folder=str(tmp_path), log_interval=2, overwrite=True)
    file_logger.init(state, None)
    for step in range(1, 5):
        file_logger.log_metrics({"x": step}, step=step)
    file_logger.log_metrics({"eval": 1})  # no step: always written
    file_logger.log_table(["a", "b"], [[1, torch.tensor(2.0)]], name="t", step=4)
    file_logger.close()
    assert read_lines(tmp_path / "metrics.jsonl") == [
        {"step": 2, "x": 2}, {"step": 4, "x": 4}, {"step": None, "eval": 1},
        {"step": 4, "table": "t", "columns": ["a", "b"], "data": [[1, 2.0]]}]


def test_captures_stdout_and_stderr_as_json_lines(tmp_path: Path) -> None:
    import sys

    state = make_state()
    file_logger = FileLogger(folder=str(tmp_path), capture_stdout=True, capture_stderr=True)
    file_logger.init(state, None)
    print("hello", "world")
    sys.stdout.write("partial ")
    sys.stdout.write("line\n")
    print("oops", file=sys.stderr)
    file_logger.log_metrics({"x": 1}, step=1)
    file_logger.close()
    print("after close is not captured")
    assert read_lines(tmp_path / "metrics.jsonl") == [
        {"stdout": "hello world"}, {"stdout": "partial line"}, {"stderr": "oops"},
        {"step": 1, "x": 1}]
    assert "write" not in vars(sys.stdout)  # the stream's own write is back


def test_flush_uploads_through_the_logger(tmp_path: Path) -> None:
    from cadence.loggers import LoggerDestination

    class Store(LoggerDestination):
        def __init__(self) -> None:
            self.uploads: list[tuple[str, str]] = []

        def can_upload_files(self) -> bool:
            return True

        def upload_file(self, state, remote_file_name, file_path, *, overwrite):
            self.uploads.append((remote_file_name, Path(file_path).read_text()))

    state = make_state()
    store = Store()
    file_logger = FileLogger(folder=str(tmp_path), flush_interval=2)
    logger = Logger(state, [file_logger, store])
    file_logger.init(state, logger)
    for _ in range(4):
        state.timestamp = state.timestamp.to_next_batch(samples=1)
        logger.log_metrics({"x": int(state.timestamp.batch)})
        file_logger.batch_end(state, logger)
    assert [name for name, _ in store.uploads] == ["my-run/metrics.jsonl"] * 2  # batches 2, 4
    assert store.uploads[-1][1].count("\n") == 4  # the whole file, flushed, at batch 4
    file_logger.close()
    assert len(store.uploads) == 3  # and at close


def test_close_with_composers_signature_uploads_the_final_file(tmp_path: Path) -> None:
    from cadence.loggers import RemoteUploaderDownloader

    state = make_state()
    store = tmp_path / "store"
    uploader = RemoteUploaderDownloader(f"file://{store}")
    file_logger = FileLogger(folder=str(tmp_path / "logs"))
    logger = Logger(state, [file_logger, uploader])
    file_logger.init(state, logger)
    state.timestamp = state.timestamp.to_next_batch(samples=8, tokens=512)
    logger.log_metrics({"loss/train/total": 2.5})
    file_logger.close(state, logger)  # Composer's close(state, logger): flush, upload, close
    file_logger.close(state, logger)  # twice is safe
    uploader.post_close()
    remote = [p for p in store.rglob("*.jsonl")]
    assert len(remote) == 1
    assert read_lines(remote[0]) == [{"step": 1, "loss/train/total": 2.5}]
