"""No code runs from a checkpoint: a sharded checkpoint's ``.metadata`` holding a
``__reduce__`` payload is refused on ``load_path``, on autoresume and by ``cadence convert``,
naming the file; the payload's side effect (a marker file) never happens. The control shows
that DCP's stock reader would have run it."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.utils.data import DataLoader

from cadence import Trainer
from cadence.cli import main as cli_main
from cadence.checkpoint import CheckpointError
from cadence.checkpoint.manifest import file_crc32c, read_manifest, write_manifest
from cadence.checkpoint.safe_unpickle import CheckpointUnpickler, RefusedGlobal
from tests.common.models import SimpleModel, make_dataloader

RUN = "unpickle"


class Payload:
    """Pickles as ``os.system("touch <marker>")``: what plain ``pickle.load`` would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def make_trainer(folder: Path, **kwargs: Any) -> Trainer:
    torch.manual_seed(0)
    data = make_dataloader(num_batches=2, batch_size=4).dataset
    return Trainer(model=SimpleModel(), train_dataloader=DataLoader(data, batch_size=4),
                   max_duration="2ba", progress_bar=False, run_name=RUN, seed=1,
                   save_folder=str(folder), save_interval="1ba", save_state_dict_type="sharded",
                   **kwargs)


@pytest.fixture()
def hostile(tmp_path: Path) -> tuple[Path, Path]:
    """A real sharded checkpoint (the latest one of its run) whose ``.metadata`` carries the
    payload inside DCP's own metadata object, its manifest updated to match; and the
    marker the payload would create."""
    folder = tmp_path / "run"
    trainer = make_trainer(folder)
    trainer.fit()
    trainer.close()
    path = folder / "ep0-ba2"
    assert (folder / f"latest-{RUN}").read_text().strip() == "ep0-ba2"
    marker = tmp_path / "payload-ran"
    metadata = pickle.loads((path / ".metadata").read_bytes())  # our own file: trusted here
    metadata.planner_data = {"x": Payload(marker)}
    (path / ".metadata").write_bytes(pickle.dumps(metadata))
    # an attacker who also updates the checksum manifest: the unpickler is what stops it
    digests = read_manifest(path / "manifest.json")
    assert digests is not None and ".metadata" in digests
    digests[".metadata"] = file_crc32c(path / ".metadata")
    write_manifest(path / "manifest.json", digests)
    return path, marker


def _assert_refused(message: str, path: Path) -> None:
    assert str(path / ".metadata") in message
    assert "holds an object that is not allowed in a checkpoint" in message
    assert "posix.system" in message
    assert "truncated or corrupt" not in message


def test_payload_is_live_for_dcp_own_reader(hostile: tuple[Path, Path]) -> None:
    """Control: torch's FileSystemReader unpickles ``.metadata`` with plain pickle and runs it."""
    path, marker = hostile
    FileSystemReader(str(path)).read_metadata()
    assert marker.exists()


def test_load_path_refuses_payload(hostile: tuple[Path, Path], tmp_path: Path) -> None:
    path, marker = hostile
    with pytest.raises(CheckpointError) as info:
        make_trainer(tmp_path / "other", load_path=str(path))
    _assert_refused(str(info.value), path)
    assert not marker.exists()


def test_autoresume_refuses_payload(hostile: tuple[Path, Path]) -> None:
    path, marker = hostile
    with pytest.raises(CheckpointError) as info:
        make_trainer(path.parent, autoresume=True)
    _assert_refused(str(info.value), path)
    assert not marker.exists()


def test_convert_refuses_payload(hostile: tuple[Path, Path], tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    path, marker = hostile
    for to, out in (("full", tmp_path / "out.pt"), ("hf", tmp_path / "hf")):
        assert cli_main(["convert", str(path), "--to", to, str(out)]) == 1
        _assert_refused(capsys.readouterr().err, path)
        assert not out.exists()
    assert not marker.exists()


def test_unpickler_admits_real_metadata_and_refuses_builtins_that_run_code(
        tmp_path: Path) -> None:
    """What a real ``.metadata`` holds loads equal to plain pickle's result; ``eval``,
    ``getattr`` and tensors (whose storages unpickle through ``torch.load``) do not."""
    import io

    folder = tmp_path / "run"
    trainer = make_trainer(folder)
    trainer.fit()
    trainer.close()
    raw = (folder / "ep0-ba1" / ".metadata").read_bytes()
    assert CheckpointUnpickler(io.BytesIO(raw)).load() == pickle.loads(raw)
    for hostile in (eval, getattr, torch.load):
        with pytest.raises(RefusedGlobal):
            CheckpointUnpickler(io.BytesIO(pickle.dumps(hostile))).load()
    with pytest.raises(pickle.UnpicklingError):
        CheckpointUnpickler(io.BytesIO(pickle.dumps(torch.zeros(2)))).load()
