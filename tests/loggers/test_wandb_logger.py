"""WandBLogger: offline runs of the real ``wandb`` (``WANDB_MODE=offline``, set in
tests/conftest.py), plus a fake ``wandb`` module for the bookkeeping.

wandb 0.31 writes no ``files/wandb-summary.json`` for an offline run (the summary file is
made when a run is synced); everything logged is in the run's transaction log,
``offline-run-*/run-<id>.wandb``, which :func:`read_offline_run` reads.
"""

from __future__ import annotations

import json
import struct
import sys
import time
import types
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from cadence import State, Trainer
from cadence.utils import dist
from cadence.loggers import FileLogger, InMemoryLogger, Logger, WandBLogger
from tests.common.models import SimpleModel, make_dataloader

pytest.importorskip("wandb")

_BLOCK = 32768  # the leveldb-log block size wandb uses; records never straddle blocks
_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)


def _records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data.startswith(_HEADER), f"{path} is not a wandb transaction log"
    records, pending, pos = [], b"", len(_HEADER)
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        if pos + 7 + length > len(data):  # a record still being written
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST fragment
            records.append(pending)
            pending = b""
    return records


def _key(item: Any) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


def _parse(raw: bytes) -> Any:
    from wandb.proto import wandb_internal_pb2

    record = wandb_internal_pb2.Record()
    record.ParseFromString(raw)
    return record


def read_offline_run(run_dir: Path, timeout: float = 20.0) -> dict[str, Any]:
    """``{"name", "project", "tags", "group", "config", "summary", "history"}`` of a finished
    offline run, from its transaction log.

    ``run.finish()`` can return before wandb-core has flushed the log (seen once in about ten
    runs, with the service shared between processes through ``WANDB_SERVICE``), so this waits
    up to ``timeout`` seconds for the log's last record, ``exit``.
    """
    (log_file,) = run_dir.glob("run-*.wandb")
    deadline = time.monotonic() + timeout
    records = [_parse(raw) for raw in _records(log_file)]
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, f"{log_file} has no exit record after {timeout} s"
        time.sleep(0.1)
        records = [_parse(raw) for raw in _records(log_file)]
    run: dict[str, Any] = {"config": {}, "summary": {}, "history": []}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.update(name=record.run.display_name, project=record.run.project,
                       tags=list(record.run.tags), group=record.run.run_group)
            for item in record.run.config.update:
                run["config"][_key(item)] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                run["config"][_key(item)] = json.loads(item.value_json)
        elif kind == "summary":
            for item in record.summary.update:
                run["summary"][_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            run["history"].append({_key(i): json.loads(i.value_json) for i in record.history.item})
    return run


def offline_runs(folder: Path) -> list[Path]:
    return sorted((folder / "wandb").glob("offline-run-*"))


# -- the real wandb, offline ----------------------------------------------------------------
def test_offline_run_holds_metrics_and_hyperparameters(tmp_path: Path) -> None:
    memory = InMemoryLogger()
    wandb_logger = WandBLogger(project="cadence-tests", tags=["ci"], dir=str(tmp_path / "wb"))
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=3),
                      eval_dataloader=make_dataloader(num_batches=1, seed=1),
                      max_duration="2ep", log_interval="2ba", seed=0, progress_bar=False,
                      run_name="wb-test", save_folder=str(tmp_path / "save"),
                      loggers=[wandb_logger, memory],
                      hyperparameters={"optimizer": {"name": "adamw", "lr": 1e-3}})
    trainer.fit()
    assert wandb_logger.run is not None
    trainer.close()
    trainer.close()  # idempotent
    assert wandb_logger.run is None
    (run_dir,) = offline_runs(tmp_path / "wb")
    assert not (tmp_path / "save" / "wandb").exists()  # dir= wins over save_folder
    run = read_offline_run(run_dir)
    assert run["name"] == "wb-test" and run["project"] == "cadence-tests"
    assert run["tags"] == ["ci"]
    assert run["config"]["optimizer"] == {"name": "adamw", "lr": 1e-3}
    assert run["config"]["rank_zero_seed"] == 0
    # The summary holds the last value of every metric, the same as was logged.
    for key in ("loss/train/total", "metrics/eval/MulticlassAccuracy"):
        assert run["summary"][key] == pytest.approx(memory.most_recent_values[key])
    steps, losses = memory.steps_and_values("loss/train/total")
    history = [(row["_step"], row["loss/train/total"]) for row in run["history"]
               if "loss/train/total" in row]
    assert history == [(s, pytest.approx(v)) for s, v in zip(steps, losses)]
    assert steps == [1, 2, 4, 6]


def _artifacts(run_dir: Path) -> list[Any]:
    """The artifact records of a finished offline run (read after its ``exit``)."""
    read_offline_run(run_dir)  # waits for the exit record
    (log_file,) = run_dir.glob("run-*.wandb")
    return [r.artifact for r in map(_parse, _records(log_file))
            if r.WhichOneof("record_type") == "artifact"]


def test_log_artifacts_stores_every_checkpoint(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import base64
    import hashlib

    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))  # W&B's staging copies
    monkeypatch.chdir(tmp_path)  # uploaded as save_folder's path / save_filename (Composer's)
    wandb_logger = WandBLogger(project="cadence-tests", dir=str(tmp_path / "wb"),
                               log_artifacts=True)
    assert wandb_logger.can_upload_files() and not WandBLogger().can_upload_files()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=2),
                      max_duration="2ep", seed=0, progress_bar=False, run_name="wb-art",
                      save_folder="{run_name}/checkpoints", save_interval="1ep",
                      loggers=[wandb_logger])
    trainer.fit()
    trainer.close()
    checkpoints = {p.name: p.read_bytes() for p in (tmp_path / "wb-art").rglob("*.pt")
                   if not p.is_symlink()}  # not the latest-rank0.pt link
    assert len(checkpoints) == 2
    (run_dir,) = offline_runs(tmp_path / "wb")
    models = [a for a in _artifacts(run_dir) if a.type == "model"]
    assert len(models) == 2
    by_batch = {json.loads(a.metadata)["timestamp/batch"]: a for a in models}
    assert sorted(by_batch) == [2, 4]
    for batch, artifact in by_batch.items():
        assert sorted(artifact.aliases) == sorted(["latest", f"ep{batch // 2}-ba{batch}"])
        (entry,) = artifact.manifest.contents
        data = checkpoints[Path(entry.path).name]  # the file, byte for byte (MD5)
        assert entry.size == len(data)
        assert entry.digest == base64.b64encode(hashlib.md5(data).digest()).decode()
        # named after the remote file name, '/' replaced (W&B allows [A-Za-z0-9._-])
        assert artifact.name.endswith(f"{entry.path}") and "/" not in artifact.name
        assert artifact.name.startswith("wb-art.")


def test_default_dir_is_the_save_folder(tmp_path: Path) -> None:
    wandb_logger = WandBLogger()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=1),
                      max_duration="1ba", seed=0, progress_bar=False, run_name="r",
                      save_folder=str(tmp_path / "{run_name}"), loggers=[wandb_logger])
    trainer.fit()
    trainer.close()
    assert len(offline_runs(tmp_path / "r")) == 1


def test_wandb_dir_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no ``dir``, WANDB_DIR wins over the save folder (as wandb itself does)."""
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "scratch"))
    wandb_logger = WandBLogger()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=1),
                      max_duration="1ba", seed=0, progress_bar=False, run_name="scratchy",
                      save_folder=str(tmp_path / "save"), save_interval=None,
                      loggers=[wandb_logger])
    trainer.fit()
    trainer.close()
    (run_dir,) = offline_runs(tmp_path / "scratch")
    assert read_offline_run(run_dir)["name"] == "scratchy"
    assert not (tmp_path / "save" / "wandb").exists()


@pytest.mark.world_size(2)
def test_rank_zero_destinations_write_once_under_two_ranks(tmp_path: Path) -> None:
    """WandBLogger and FileLogger write on rank zero only; FileLogger(log_all_ranks=True)
    writes one file per rank."""
    gen = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(16, 8, generator=gen),
                            torch.randint(0, 3, (16,), generator=gen))
    loader = DataLoader(dataset, batch_size=2, sampler=dist.get_sampler(dataset, shuffle=False))
    wandb_logger = WandBLogger(dir=str(tmp_path / "wb"))
    trainer = Trainer(model=SimpleModel(), train_dataloader=loader, max_duration="4ba",
                      log_interval="1ba", seed=0, progress_bar=False, run_name="two",
                      save_folder=str(tmp_path / "save"),
                      loggers=[wandb_logger, FileLogger(),
                               FileLogger(folder=str(tmp_path / "all"), log_all_ranks=True)])
    trainer.fit()
    trainer.close()
    assert wandb_logger.run is None  # finished on rank 0, never started on rank 1
    dist.barrier()
    (run_dir,) = offline_runs(tmp_path / "wb")
    run = read_offline_run(run_dir)
    assert run["summary"]["loss/train/total"] > 0
    lines = (tmp_path / "save" / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines if "loss/train/total" in line]
    assert steps == [1, 2, 3, 4]  # once each, not once per rank
    assert not list((tmp_path / "save").glob("metrics_rank*"))
    per_rank = sorted(p.name for p in (tmp_path / "all").glob("*.jsonl"))
    assert per_rank == ["metrics_rank0.jsonl", "metrics_rank1.jsonl"]
    for name in per_rank:
        assert len((tmp_path / "all" / name).read_text().splitlines()) == 4
    dist.barrier()  # rank 0 keeps the files until both ranks have read them


# -- a fake wandb: what is sent, and when ----------------------------------------------------
class FakeRun:
    def __init__(self, **kwargs: Any) -> None:
        self.init_kwargs = kwargs
        self.config = types.SimpleNamespace(data=dict(kwargs.get("config") or {}))
        self.config.update = lambda values, allow_val_change=False: self.config.data.update(values)
        self.logged: list[tuple[dict[str, Any], Optional[int]]] = []
        self.finished = 0
        self.id = kwargs.get("id", "fake-id")

    def log(self, metrics: dict[str, Any], step: Optional[int] = None) -> None:
        self.logged.append((metrics, step))

    def finish(self) -> None:
        self.finished += 1


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> list[FakeRun]:
    runs: list[FakeRun] = []

    def init(**kwargs: Any) -> FakeRun:
        runs.append(FakeRun(**kwargs))
        return runs[-1]

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    return runs


def _state(tmp_path: Path) -> State:
    return State(model=torch.nn.Linear(1, 1), run_name="fake", save_folder=str(tmp_path))


def _begin(wandb_logger: WandBLogger, state: State, logger: Logger) -> None:
    """``INIT`` then ``AFTER_LOAD``, as the Trainer fires them (the run starts at the second)."""
    wandb_logger.init(state, logger)
    wandb_logger.after_load(state, logger)


def test_buffers_until_init_converts_tensors_and_finishes_once(
        fake_wandb: list[FakeRun], tmp_path: Path) -> None:
    state = _state(tmp_path)
    wandb_logger = WandBLogger(name="shown", group="g", init_kwargs={"mode": "disabled"})
    logger = Logger(state, [wandb_logger])
    logger.log_hyperparameters({"lr": torch.tensor(0.5)})
    logger.log_metrics({"early": 1.0}, step=0)
    assert fake_wandb == []  # nothing starts before the Trainer loaded its checkpoint
    _begin(wandb_logger, state, logger)
    (run,) = fake_wandb
    assert run.init_kwargs == {"name": "shown", "group": "g", "dir": str(tmp_path),
                               "mode": "disabled", "config": {"lr": 0.5}}
    logger.log_metrics({"loss/train/total": torch.tensor(2.5)}, step=3)
    logger.log_hyperparameters({"seed": 1})
    assert run.logged == [({"early": 1.0}, 0), ({"loss/train/total": 2.5}, 3)]
    assert isinstance(run.logged[1][0]["loss/train/total"], float)
    assert run.config.data == {"lr": 0.5, "seed": 1}
    wandb_logger.close()
    wandb_logger.close()
    assert run.finished == 1
    logger.log_metrics({"late": 1.0}, step=4)  # after close: dropped, no error
    assert len(run.logged) == 2


def test_dir_argument_wins_over_wandb_dir(fake_wandb: list[FakeRun], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "scratch"))
    state = _state(tmp_path / "save")
    for wandb_logger, expected in ((WandBLogger(dir=str(tmp_path / "mine")), tmp_path / "mine"),
                                   (WandBLogger(), tmp_path / "scratch")):
        _begin(wandb_logger, state, Logger(state, [wandb_logger]))
        assert fake_wandb[-1].init_kwargs["dir"] == str(expected)
        assert expected.is_dir()
    monkeypatch.setenv("WANDB_DIR", "")  # empty: unset, the save folder is used
    wandb_logger = WandBLogger()
    _begin(wandb_logger, state, Logger(state, [wandb_logger]))
    assert fake_wandb[-1].init_kwargs["dir"] == str(tmp_path / "save")


def test_rank_zero_only(fake_wandb: list[FakeRun], tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    state = _state(tmp_path)
    quiet = WandBLogger()
    _begin(quiet, state, Logger(state, [quiet]))
    quiet.log_metrics({"x": 1.0}, step=1)
    quiet.close()
    assert fake_wandb == []
    every_rank = WandBLogger(rank_zero_only=False)
    _begin(every_rank, state, Logger(state, [every_rank]))
    (run,) = fake_wandb
    assert run.init_kwargs["name"] == "fake-rank1" and run.init_kwargs["group"] == "fake"


def test_missing_wandb_says_how_to_install(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    wandb_logger = WandBLogger()
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now raises ImportError
    with pytest.raises(ImportError, match="pip install wandb"):
        WandBLogger()
    state = _state(tmp_path)
    with pytest.raises(ImportError, match="pip install wandb"):
        _begin(wandb_logger, state, Logger(state, [wandb_logger]))


def test_config_in_init_kwargs_is_the_initial_config(fake_wandb: list[FakeRun],
                                                     tmp_path: Path) -> None:
    """Composer passes ``init_kwargs['config']`` to ``wandb.init`` (llm-foundry does so);
    hyperparameters logged before the run starts are merged over it."""
    state = _state(tmp_path)
    wandb_logger = WandBLogger(init_kwargs={"config": {"a": 1, "lr": 0.1}, "mode": "disabled"})
    logger = Logger(state, [wandb_logger])
    logger.log_hyperparameters({"lr": 0.5})
    _begin(wandb_logger, state, logger)
    (run,) = fake_wandb
    assert run.init_kwargs["config"] == {"a": 1, "lr": 0.5}
    wandb_logger.close()
    with pytest.raises(TypeError, match="config"):
        WandBLogger(init_kwargs={"config": "not a dict"})


def test_a_resumed_run_continues_the_checkpoints_wandb_run(fake_wandb: list[FakeRun],
                                                            tmp_path: Path) -> None:
    state = _state(tmp_path)
    wandb_logger = WandBLogger()
    logger = Logger(state, [wandb_logger])
    wandb_logger.init(state, logger)
    (carrier,) = [c for c in state.callbacks if type(c).__name__ == "TrackerRunState"]
    carrier.load_state_dict({"logger": "WandBLogger", "run_name": "fake", "run_id": "abc123"})
    wandb_logger.after_load(state, logger)
    (run,) = fake_wandb
    assert run.init_kwargs["id"] == "abc123" and run.init_kwargs["resume"] == "allow"
    assert carrier.state_dict()["run_id"] == "abc123"  # kept in the next checkpoint
    wandb_logger.close()
    fresh = WandBLogger()
    _begin(fresh, state, Logger(state, [fresh]))
    assert "id" not in fake_wandb[-1].init_kwargs and "resume" not in fake_wandb[-1].init_kwargs
