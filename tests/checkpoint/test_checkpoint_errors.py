"""Broken checkpoints fail loudly, naming the file: truncated, garbage, a missing shard, a
missing path, objects that ``torch.load(weights_only=True)`` refuses; and the finders skip
temporaries and unfinished sharded directories."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Callback, Trainer, dist
from cadence.cli import main as cli_main
from cadence.checkpoint import (
    CheckpointError, find_latest_checkpoint, is_complete, load_checkpoint,
)
from cadence.checkpoint.store import write_latest
from tests.common.models import SimpleModel, make_dataloader

RUN = "err"


def make_trainer(folder: Path | None = None, fmt: str = "full", callbacks: Any = (),
                 fsdp: bool = False, **kwargs: Any) -> Trainer:
    torch.manual_seed(0)
    data = make_dataloader(num_batches=2, batch_size=4).dataset
    loader = DataLoader(data, batch_size=4 // dist.get_world_size(),
                        sampler=dist.get_sampler(data, shuffle=False))
    return Trainer(
        model=SimpleModel(), train_dataloader=loader, max_duration="2ba",
        progress_bar=False, run_name=RUN, seed=1, callbacks=callbacks,
        save_folder=None if folder is None else str(folder), save_interval="1ba",
        save_state_dict_type=fmt,
        parallelism_config={"fsdp": {"state_dict_type": fmt}} if fsdp else None, **kwargs)


def saved_checkpoint(folder: Path, fmt: str) -> Path:
    """Train 2 batches saving each; the path of the checkpoint after batch 1."""
    trainer = make_trainer(folder, fmt)
    trainer.fit()
    trainer.close()
    path = folder / ("ep0-ba1-rank0.pt" if fmt == "full" else "ep0-ba1")
    assert is_complete(path)
    return path


def load_error(path: Path) -> str:
    """Load ``path`` into a fresh state (directly and through ``load_path``); the message."""
    with pytest.raises(CheckpointError) as direct:
        load_checkpoint(make_trainer().state, path)
    with pytest.raises(CheckpointError) as through_trainer:
        make_trainer(load_path=str(path))
    assert str(direct.value) == str(through_trainer.value)
    return str(direct.value)


def test_truncated_full_file_names_it(tmp_path: Path) -> None:
    path = saved_checkpoint(tmp_path, "full")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    message = load_error(path)
    assert str(path) in message and "truncated or corrupt" in message


def test_garbage_full_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "garbage.pt"
    path.write_bytes(random.Random(0).randbytes(4096))  # fixed: the same bytes every run
    message = load_error(path)
    assert str(path) in message and "is not a checkpoint (not a torch.save file" in message
    assert "weights_only=False" not in message


def test_garbage_extra_file_of_sharded_names_it(tmp_path: Path) -> None:
    path = saved_checkpoint(tmp_path, "sharded")
    (path / "extra.pt").write_bytes(random.Random(1).randbytes(512))
    assert str(path / "extra.pt") in load_error(path)


def test_missing_shard_single_process(tmp_path: Path) -> None:
    path = saved_checkpoint(tmp_path, "sharded")
    assert sorted(p.name for p in path.glob("*.distcp")) == ["__0_0.distcp"]
    (path / "__0_0.distcp").unlink()
    message = load_error(path)
    assert str(path / "__0_0.distcp") in message and "FileNotFoundError" in message
    assert "Traceback" not in message  # one line per rank, not DCP's tracebacks
    assert cli_main(["convert", str(path), "--to", "full", str(tmp_path / "out.pt")]) == 1
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.world_size(2)
def test_missing_shard_two_ranks(tmp_path: Path) -> None:
    """Written by 2 FSDP ranks (one shard file each); with ``__0_0.distcp`` gone, both ranks
    raise (no rank hangs in a collective) and both name the missing file."""
    folder = tmp_path / "two"
    trainer = make_trainer(folder, "sharded", fsdp=True)
    trainer.fit()
    trainer.close()
    path = folder / "ep0-ba1"
    assert sorted(p.name for p in path.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    dist.barrier()
    if dist.get_global_rank() == 0:
        (path / "__0_0.distcp").unlink()
    dist.barrier()
    fresh = make_trainer(fmt="sharded", fsdp=True)
    with pytest.raises(CheckpointError, match="__0_0.distcp") as info:
        load_checkpoint(fresh.state, path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("name", ["nope.pt", "nope"])
def test_load_path_that_does_not_exist(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    with pytest.raises(CheckpointError, match="does not exist") as info:
        make_trainer(load_path=str(path))
    assert str(path) in str(info.value)


def test_unfinished_sharded_directory_and_temporary_are_refused(tmp_path: Path) -> None:
    path = saved_checkpoint(tmp_path, "sharded")
    (path / ".metadata").unlink()
    message = load_error(path)
    assert str(path) in message and ".metadata" in message
    tmp = tmp_path / "ep0-ba9-rank0.pt.tmp-0123abcd"
    tmp.write_bytes(b"x" * 10)
    assert "unfinished save" in load_error(tmp)
    empty = tmp_path / "empty.pt"
    empty.touch()
    assert str(empty) in load_error(empty)


# ---------------------------------------------------------------- weights_only refusals


def _touch(path: str) -> None:  # what unpickling Evil would run: it must never run
    Path(path).write_text("unpickled")


class Evil:
    """Pickles as a call to ``_touch(marker)``: code that a plain ``torch.load`` would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _touch, (str(self.marker),)


class Holder(Callback):
    """A callback whose state holds an arbitrary object."""

    def __init__(self, obj: Any = None) -> None:
        self.obj = obj

    def state_dict(self) -> dict[str, Any]:
        return {"obj": self.obj}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.obj = state["obj"]


def test_full_file_with_pickled_object_is_refused(tmp_path: Path) -> None:
    path = saved_checkpoint(tmp_path, "full")
    marker = tmp_path / "ran"
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["state"]["metadata"]["note"] = Evil(marker)  # checkpoint-shaped, one foreign object
    torch.save(checkpoint, path)
    message = load_error(path)
    assert str(path) in message and "weights_only=True" in message
    assert f"GLOBAL {__name__}._touch" in message
    assert cli_main(["convert", str(path), "--to", "full", str(tmp_path / "out.pt")]) == 1
    assert not marker.exists()


def test_sharded_extra_file_with_pickled_object_is_refused(tmp_path: Path) -> None:
    path = saved_checkpoint(tmp_path, "sharded")
    marker = tmp_path / "ran"
    extra = torch.load(path / "extra.pt", weights_only=True)
    extra["timestamp"] = Evil(marker)
    torch.save(extra, path / "extra.pt")
    message = load_error(path)
    assert str(path / "extra.pt") in message and "weights_only=True" in message
    assert f"GLOBAL {__name__}._touch" in message
    assert not marker.exists()


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_callback_state_with_pickled_object_is_refused(tmp_path: Path, fmt: str) -> None:
    """Inside the checkpoint's tensors (DCP's pickled non-tensor values for ``sharded``)."""
    marker = tmp_path / "ran"
    trainer = make_trainer(tmp_path / "run", fmt, callbacks=[Holder(Evil(marker))])
    trainer.fit()
    trainer.close()
    path = tmp_path / "run" / ("ep0-ba2-rank0.pt" if fmt == "full" else "ep0-ba2")
    with pytest.raises(CheckpointError) as info:
        make_trainer(callbacks=[Holder()], load_path=str(path))
    assert str(path) in str(info.value) and "weights_only=True" in str(info.value)
    assert f"GLOBAL {__name__}._touch" in str(info.value)
    assert cli_main(["convert", str(path), "--to", "full", str(tmp_path / "out.pt")]) == 1
    assert not marker.exists()


# ---------------------------------------------------------------- finding checkpoints


def test_finders_skip_temporaries_and_unfinished_directories(tmp_path: Path) -> None:
    good = saved_checkpoint(tmp_path / "src", "full")
    sharded = saved_checkpoint(tmp_path / "src_sharded", "sharded")
    folder = tmp_path / "folder"
    folder.mkdir()
    os.replace(good, folder / "ep0-ba1-rank0.pt")
    # newer than the good one, but none of them complete:
    candidates = {
        "ep0-ba2-rank0.pt.tmp-0123abcd": "file",  # a full save not yet renamed
        "ep0-ba3.tmp-89abcdef": "sharded",  # a complete-looking directory, still a temporary
        "ep0-ba4": "no_metadata",  # a sharded directory whose save did not finish
        "ep0-ba5": "no_extra",
        "ep0-ba6-rank0.pt": "empty",
    }
    for name, kind in candidates.items():
        target = folder / name
        if kind == "file":
            target.write_bytes((folder / "ep0-ba1-rank0.pt").read_bytes())
        elif kind == "empty":
            target.touch()
        else:
            shutil.copytree(sharded, target)
            if kind == "no_metadata":
                (target / ".metadata").unlink()
            if kind == "no_extra":
                (target / "extra.pt").unlink()
        assert not is_complete(target), name
    assert is_complete(folder / "ep0-ba1-rank0.pt")
    assert find_latest_checkpoint(folder, f"latest-{RUN}") == folder / "ep0-ba1-rank0.pt"
    # a pointer at an incomplete checkpoint is not followed either
    for name in candidates:
        write_latest(folder, f"latest-{RUN}", name)
        assert find_latest_checkpoint(folder, f"latest-{RUN}") == folder / "ep0-ba1-rank0.pt"
    # autoresume loads the good one, not a newer temporary
    trainer = make_trainer(folder, autoresume=True)
    assert trainer.state.timestamp.batch == 1
    trainer.close()


@pytest.mark.parametrize("fmt", ["full", "sharded"])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_optimizer_that_changed_is_named_with_the_fix(tmp_path: Path, fmt: str,
                                                      momentum: float) -> None:
    """A checkpoint of the default optimizer (AdamW) loaded into a run with SGD fails with a
    CheckpointError naming the file and the fix (not torch's bare ``AssertionError: Expected
    device to be set`` or ``KeyError``); the fix it names then loads the weights and time."""
    path = saved_checkpoint(tmp_path, fmt)

    def sgd_trainer(**kwargs: Any) -> Trainer:
        torch.manual_seed(0)
        model = SimpleModel()
        return Trainer(model=model, train_dataloader=make_dataloader(num_batches=2, batch_size=4),
                       max_duration="2ba", progress_bar=False, load_path=str(path),
                       optimizers=torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum),
                       **kwargs)

    with pytest.raises(CheckpointError) as err:
        sgd_trainer()
    message = str(err.value)
    assert str(path) in message and "does not fit this run's optimizer" in message
    assert "load_weights_only=True" in message and "load_ignore_keys=['optimizers']" in message
    trainer = sgd_trainer(load_ignore_keys=["optimizers"])
    assert trainer.state.timestamp.batch.value == 1
    saved = make_trainer(load_path=str(path)).state.model.state_dict()
    for name, tensor in trainer.state.model.state_dict().items():
        assert torch.equal(tensor, saved[name]), name
