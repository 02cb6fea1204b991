"""Leftovers: a save that fails (a full disk, a bug) removes its temporary and, for a full
disk, says which file it was writing and that the previous checkpoint is intact; a starting
run removes its own stale temporaries and leaves other runs' alone.

The full disk is injected at the raw file layer: every file a save writes goes through
``HashingFile``; the test wraps the raw file of the second checkpoint in one that writes
what fits in 1000 bytes and then raises ``OSError(ENOSPC)``, as ``write(2)`` does on a full
disk (a real tmpfs needs mount privileges that CI does not have).
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Callback, Trainer
from cadence.checkpoint import CheckpointWriteError
from cadence.checkpoint.files import TMP_MARK, run_tag
from cadence.checkpoint.manifest import HashingFile
from tests.common.models import SimpleModel, make_dataloader

RUN = "left"


def make_trainer(folder: Path, fmt: str = "full", batches: int = 2, **kwargs: Any) -> Trainer:
    torch.manual_seed(0)
    data = make_dataloader(num_batches=batches, batch_size=4).dataset
    return Trainer(model=SimpleModel(), train_dataloader=DataLoader(data, batch_size=4),
                   max_duration=f"{batches}ba", progress_bar=False, run_name=RUN, seed=1,
                   save_folder=str(folder), save_interval="1ba", save_state_dict_type=fmt,
                   **kwargs)


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if TMP_MARK in p.name)


class DiskFillsUp:
    """A raw file on a disk with ``room`` bytes left: writes what fits, then ENOSPC."""

    def __init__(self, raw: Any, room: int) -> None:
        self.raw, self.room = raw, room

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if view.nbytes > self.room:
            self.raw.write(view[:self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= view.nbytes
        return self.raw.write(view)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_no_space_left_removes_temporary_and_names_files(
        tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "run"
    real_init = HashingFile.__init__
    written: list[Path] = []

    def init(self: HashingFile, raw: Any, name: Path, *args: Any, **kwargs: Any) -> None:
        if "ep0-ba2" in str(name):  # the second checkpoint's files
            written.append(Path(name))
            raw = DiskFillsUp(raw, room=1000)
        real_init(self, raw, name, *args, **kwargs)

    monkeypatch.setattr(HashingFile, "__init__", init)
    trainer = make_trainer(folder, fmt)
    with pytest.raises(CheckpointWriteError) as info:
        trainer.fit()
    trainer.close()
    monkeypatch.undo()
    previous = folder / ("ep0-ba1-rank0.pt" if fmt == "full" else "ep0-ba1")
    assert str(info.value).startswith(f"no space left on device while writing {written[0]}; "
                                      f"the previous checkpoint {previous} is intact")
    assert info.value.errno == errno.ENOSPC
    assert "unexpected pos" not in str(info.value)
    assert not written[0].exists()
    assert temporaries(folder) == []
    assert (folder / f"latest-{RUN}").read_text().strip() == previous.name
    resumed = make_trainer(folder, fmt, autoresume=True)  # the intact one resumes
    assert int(resumed.state.timestamp.batch) == 1
    resumed.fit()
    assert int(resumed.state.timestamp.batch) == 2
    resumed.close()


class Unpicklable(Callback):
    """A callback whose state cannot be saved (a bug in user code, not a disk error)."""

    def state_dict(self) -> dict[str, Any]:
        return {"fn": lambda: None}


def test_failed_save_from_a_bug_removes_its_temporary(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    trainer = make_trainer(folder, callbacks=[Unpicklable()])
    with pytest.raises(Exception, match="lambda") as info:
        trainer.fit()
    trainer.close()
    assert not isinstance(info.value, CheckpointWriteError)  # its own error, own traceback
    assert temporaries(folder) == []
    assert not (folder / "ep0-ba1-rank0.pt").exists()


def test_starting_run_removes_only_its_own_stale_temporaries(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "run"
    trainer = make_trainer(folder, batches=1)
    trainer.fit()
    trainer.close()
    mine, theirs = run_tag(RUN), run_tag("other-run")
    own = [f"ep0-ba2-rank0.pt{TMP_MARK}{mine}-0badc0de",  # a killed full save
           f"ep0-ba3{TMP_MARK}{mine}-12345678",  # a killed sharded save (a directory)
           f"latest-{RUN}{TMP_MARK}{mine}-k2j4h5",  # a killed pointer update
           f"latest-{RUN}{TMP_MARK}a8b7c6"]
    others = [f"ep0-ba2-rank0.pt{TMP_MARK}{theirs}-0badc0de",  # another run in the same folder
              "ep0-ba9-rank0.pt.tmp-0123abcd",  # no run tag: cannot tell whose
              f"latest-other-run{TMP_MARK}{theirs}-x1y2z3"]
    for name in own + others:
        if name.startswith("ep0-ba3"):
            (folder / name).mkdir()
            (folder / name / "__0_0.distcp").write_bytes(b"x" * 100)
        else:
            (folder / name).write_bytes(b"x" * 100)
    with caplog.at_level(logging.INFO):
        resumed = make_trainer(folder, batches=1, autoresume=True)
    assert temporaries(folder) == sorted(others)
    assert int(resumed.state.timestamp.batch) == 1
    assert any("stale temporaries" in r.getMessage() and own[0] in r.getMessage()
               for r in caplog.records)
    resumed.close()


@pytest.mark.world_size(2)
def test_no_space_left_on_one_rank_fails_every_rank(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1's shard hits a full disk: both ranks raise (neither waits in a barrier for the
    other), naming rank 1's shard, and the temporary directory is gone."""
    from cadence import dist

    folder = tmp_path / "two"
    real_init = HashingFile.__init__

    def init(self: HashingFile, raw: Any, name: Path, *args: Any, **kwargs: Any) -> None:
        if dist.get_global_rank() == 1 and name.name.startswith("__1_"):
            raw = DiskFillsUp(raw, room=1000)
        real_init(self, raw, name, *args, **kwargs)

    monkeypatch.setattr(HashingFile, "__init__", init)
    torch.manual_seed(0)
    data = make_dataloader(num_batches=1, batch_size=4).dataset
    trainer = Trainer(model=SimpleModel(), train_dataloader=DataLoader(
                          data, batch_size=2, sampler=dist.get_sampler(data, shuffle=False)),
                      max_duration="1ba", progress_bar=False, run_name=RUN, seed=1,
                      save_folder=str(folder), save_interval="1ba",
                      parallelism_config={"fsdp": {"state_dict_type": "sharded"}})
    with pytest.raises(CheckpointWriteError, match="no space left on device while writing") as info:
        trainer.fit()
    trainer.close()
    assert "__1_0.distcp" in str(info.value)
    assert f"no earlier checkpoint is in {folder}" in str(info.value)
    dist.barrier()
    assert temporaries(folder) == []
    assert not (folder / "ep0-ba1").exists()


def test_remove_checkpoint_unlinks_a_symlink_and_keeps_its_target(tmp_path: Path) -> None:
    """Rotation and cleanup delete a checkpoint directory or file; a checkpoint that is a
    symlink (moved to another disk and linked back) loses the link, never what it points
    to (``shutil.rmtree`` on the link failed, and the error was ignored: nothing went)."""
    from cadence.checkpoint.files import remove_checkpoint

    target = tmp_path / "elsewhere" / "ep0-ba1"
    target.mkdir(parents=True)
    (target / "__0_0.distcp").write_bytes(b"shard")
    link = tmp_path / "run" / "ep0-ba1"
    link.parent.mkdir()
    link.symlink_to(target, target_is_directory=True)
    remove_checkpoint(link)
    assert not os.path.lexists(link) and (target / "__0_0.distcp").read_bytes() == b"shard"
    full = tmp_path / "run" / "ep0-ba2-rank0.pt"
    full.write_bytes(b"x")
    for path in (target, full, tmp_path / "run" / "missing"):
        remove_checkpoint(path)
        assert not os.path.lexists(path)
