"""Pointer confinement: the ``latest`` pointer is resolved only inside its save folder (an
absolute path, ``..`` or a symlink out is refused, though the target is a complete
checkpoint), binary garbage in it is named; a truncated shard names the shard file."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Trainer
from cadence.checkpoint import CheckpointError, is_complete
from tests.common.models import SimpleModel, make_dataloader

RUN = "ptr"
LATEST = f"latest-{RUN}"


def make_trainer(folder: Path | None, fmt: str = "full", **kwargs: Any) -> Trainer:
    torch.manual_seed(0)
    data = make_dataloader(num_batches=1, batch_size=4).dataset
    return Trainer(model=SimpleModel(), train_dataloader=DataLoader(data, batch_size=4),
                   max_duration="1ba", progress_bar=False, run_name=RUN, seed=1,
                   save_folder=None if folder is None else str(folder), save_interval="1ba",
                   save_state_dict_type=fmt, **kwargs)


def saved(folder: Path, fmt: str = "full") -> Path:
    trainer = make_trainer(folder, fmt)
    trainer.fit()
    trainer.close()
    path = folder / ("ep0-ba1-rank0.pt" if fmt == "full" else "ep0-ba1")
    assert is_complete(path)
    return path


@pytest.fixture()
def folders(tmp_path: Path) -> tuple[Path, Path]:
    """An empty save folder of run ``ptr`` and, outside it, a complete checkpoint of the run."""
    outside = saved(tmp_path / "elsewhere")
    folder = tmp_path / "run"
    folder.mkdir()
    return folder, outside


def autoresume_error(folder: Path) -> str:
    with pytest.raises(CheckpointError) as info:
        make_trainer(folder, autoresume=True)
    return str(info.value)


@pytest.mark.parametrize("target", ["/etc/hostname", "../elsewhere/ep0-ba1-rank0.pt", "link.pt"])
def test_pointer_outside_its_folder_is_refused(folders: tuple[Path, Path], target: str) -> None:
    folder, outside = folders
    if target == "link.pt":  # inside by name, outside by symlink
        (folder / "link.pt").symlink_to(outside)
    else:
        assert is_complete(folder / target) or target.startswith("/")
    (folder / LATEST).write_text(target + "\n")
    message = autoresume_error(folder)
    assert str(folder / LATEST) in message and repr(target) in message
    assert "outside its folder" in message


def test_pointer_with_binary_garbage_is_named(folders: tuple[Path, Path]) -> None:
    folder, _ = folders
    (folder / LATEST).write_bytes(b"\x00\xff\x13garbage\x80\x81")
    message = autoresume_error(folder)
    assert str(folder / LATEST) in message and "binary data" in message


def test_pointer_inside_its_folder_still_works(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    path = saved(folder)
    (folder / "sub").mkdir()
    shutil.move(str(path), folder / "sub" / path.name)
    (folder / LATEST).write_text(f"sub/{path.name}\n")
    trainer = make_trainer(folder, autoresume=True)
    assert int(trainer.state.timestamp.batch) == 1
    trainer.close()


@pytest.mark.parametrize("manifest", [True, False])
def test_truncated_shard_names_the_shard_file(tmp_path: Path, manifest: bool) -> None:
    """With a manifest the size check names it; without one (an older checkpoint) the
    reader compares the file with the offsets ``.metadata`` records."""
    path = saved(tmp_path / "run", "sharded")
    shard = path / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    if not manifest:
        (path / "manifest.json").unlink()
    with pytest.raises(CheckpointError) as info:  # an older checkpoint: loaded unverified
        make_trainer(None, "sharded", load_path=str(path), require_checksums=manifest)
    assert str(shard) in str(info.value) and "truncated" in str(info.value)


def test_shard_path_outside_the_directory_is_refused(tmp_path: Path) -> None:
    """A ``.metadata`` (checksums updated to match) whose storage entries name a file outside
    the checkpoint directory: that file is never read."""
    import dataclasses
    import pickle

    from cadence.checkpoint.manifest import file_crc32c, read_manifest, write_manifest

    path = saved(tmp_path / "run", "sharded")
    outside = tmp_path / "outside.distcp"
    shutil.copy(path / "__0_0.distcp", outside)  # a well-formed shard: loads if it is read
    metadata = pickle.loads((path / ".metadata").read_bytes())
    metadata.storage_data = {k: dataclasses.replace(v, relative_path="../../outside.distcp")
                             for k, v in metadata.storage_data.items()}
    (path / ".metadata").write_bytes(pickle.dumps(metadata))
    digests = read_manifest(path / "manifest.json")
    assert digests is not None
    digests[".metadata"] = file_crc32c(path / ".metadata")
    del digests["__0_0.distcp"]
    write_manifest(path / "manifest.json", digests)
    (path / "__0_0.distcp").unlink()  # only the outside copy could satisfy the reads
    with pytest.raises(CheckpointError, match="not a file of its checkpoint directory") as info:
        make_trainer(None, "sharded", load_path=str(path))
    assert "../../outside.distcp" in str(info.value)
