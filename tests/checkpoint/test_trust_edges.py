"""Issue 25, checkpoint-side weak items, each with its message asserted: poisoned and foreign
files never pass on PyTorch's ``weights_only=False`` advice; a pointer naming nothing usable
is warned about; a ``.metadata`` asking for 10 GB is refused before allocating it;
``save_num_checkpoints_to_keep=0`` with autoresume is refused at start; a killed save's
symlink temporary is removed at the next start; a run folder as ``load_path`` is refused at
the value stage."""

from __future__ import annotations

import logging
import os
import pickle
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Trainer
from cadence.checkpoint import CheckpointError
from cadence.checkpoint.store import read_latest
from cadence.config.load import ConfigError, load_config
from tests.common.models import SimpleModel, make_dataloader

RUN = "edges"
LATEST = f"latest-{RUN}"


class _Payload:
    def __reduce__(self) -> Any:
        return (os.system, ("echo pwned > /dev/null",))


def _trainer(folder: Path | None = None, **kwargs: Any) -> Trainer:
    torch.manual_seed(0)
    loader = DataLoader(make_dataloader(num_batches=2, batch_size=4).dataset, batch_size=4)
    return Trainer(model=SimpleModel(), train_dataloader=loader, max_duration="2ba",
                   progress_bar=False, run_name=RUN, seed=1,
                   save_folder=None if folder is None else str(folder), save_interval="1ba",
                   **kwargs)


def _fit(folder: Path, **kwargs: Any) -> Trainer:
    trainer = _trainer(folder, **kwargs)
    trainer.fit()
    trainer.close()
    return trainer


def _load_message(path: Path) -> str:
    with pytest.raises(CheckpointError) as info:
        _trainer(load_path=str(path))
    message = str(info.value)
    assert "weights_only=False" not in message and "will likely succeed" not in message
    assert str(path) in message
    return message


def test_poisoned_and_foreign_files_never_suggest_unsafe_loading(tmp_path: Path) -> None:
    raw = tmp_path / "raw.pt"
    raw.write_bytes(pickle.dumps(_Payload()))
    assert "is not a checkpoint (a raw pickle" in _load_message(raw)
    poisoned = tmp_path / "poisoned.pt"
    torch.save({"model": _Payload()}, poisoned)
    message = _load_message(poisoned)
    assert "holds objects a checkpoint must not hold" in message
    assert "posix.system" in message and "nothing in it ran" in message
    hostname = tmp_path / "hostname"
    hostname.write_text("my-host\n")
    assert "is not a checkpoint (not a torch.save file" in _load_message(hostname)
    sharded = tmp_path / "run"
    _fit(sharded, save_state_dict_type="sharded")
    torch.save({"metadata": _Payload()}, sharded / "ep0-ba1" / "extra.pt")
    message = _load_message(sharded / "ep0-ba1")
    assert "extra.pt holds objects a checkpoint must not hold" in message


@pytest.mark.parametrize("content,what", [("ep9-ba99-rank0.pt", "does not exist"),
                                          ("hello world", "does not exist"),
                                          (".", "is its own folder")])
def test_pointer_naming_nothing_usable_is_warned_about(tmp_path: Path, content: str, what: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "run"
    _fit(folder)
    (folder / LATEST).write_text(content + "\n")
    with caplog.at_level(logging.WARNING):
        assert read_latest(folder, LATEST) is None
        resumed = _trainer(folder, autoresume=True)  # the newest complete one instead
    resumed.close()
    assert resumed.hyperparameters["loaded_checkpoint"] == str(folder / "ep0-ba2-rank0.pt")
    assert f"The latest pointer {folder / LATEST} holds {content!r}, which {what}" in caplog.text


def test_metadata_asking_for_10_gb_is_refused_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    _fit(folder, save_state_dict_type="sharded")
    metadata = folder / "ep0-ba1" / ".metadata"
    for hostile in (b"\x80\x04\x8e" + struct.pack("<Q", 10**10) + b"abc.",  # a claimed bytes8
                    b"\x80\x02cbuiltins\nbytes\n" + b"J\x00\xe4\x0bT\x85R."):  # bytes(10**10)
        metadata.write_bytes(hostile)
        with pytest.raises(CheckpointError) as info:
            _trainer(load_path=str(folder / "ep0-ba1"), require_checksums=False)
        assert str(metadata) in str(info.value)
        assert "asks for an object larger than the file itself" in str(info.value)


def test_keep_zero_with_autoresume_and_nowhere_to_keep_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="save_num_checkpoints_to_keep=0 with autoresume=True "
                                         "and no logger destination that stores files"):
        _trainer(tmp_path / "run", autoresume=True, save_num_checkpoints_to_keep=0)


def test_killed_save_symlink_temporary_is_removed_at_start(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    _fit(folder)
    leftover = folder / "latest-rank0.pt.tmp-0badc0de"
    os.symlink("ep0-ba1-rank0.pt", leftover)  # a save killed between symlink() and replace()
    _trainer(folder, autoresume=True).close()
    assert not leftover.is_symlink() and (folder / "ep0-ba1-rank0.pt").is_file()


def test_run_folder_as_load_path_is_refused_at_the_value_stage(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    _fit(folder)
    config = tmp_path / "run.yaml"
    config.write_text("max_duration: 1ba\nglobal_train_batch_size: 4\nmodel: {name: gpt2}\n"
                      "train_loader: {name: shakespeare}\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(config), [f"load_path={folder}"])
    assert "is a folder of checkpoints (a run's save folder), not a checkpoint" in str(info.value)
    assert str(folder / "ep0-ba2-rank0.pt") in str(info.value)
