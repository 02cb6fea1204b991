"""No corrupt byte loads silently: 64 flipped bytes in the tensor data of a full ``.pt`` file
or of a ``.distcp`` shard are refused, naming the file (the controls show the same bytes load
silently without the check); autoresume falls back to the newest intact checkpoint with a
warning naming the rejected one, and every run records which checkpoint it started from."""

from __future__ import annotations

import io
import logging
import pickle
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Trainer, dist
from cadence.cli import main as cli_main
from cadence.checkpoint import CheckpointError, load_checkpoint
from cadence.checkpoint.manifest import (
    embedded_checksum, file_crc32c, read_manifest, verify_checkpoint,
)
from tests.common.models import SimpleModel, make_dataloader

RUN = "crc"


def make_trainer(folder: Path | None, fmt: str = "full", batches: int = 3, fsdp: bool = False,
                 **kwargs: Any) -> Trainer:
    torch.manual_seed(0)
    data = make_dataloader(num_batches=batches, batch_size=4).dataset
    loader = DataLoader(data, batch_size=4 // dist.get_world_size(),
                        sampler=dist.get_sampler(data, shuffle=False))
    return Trainer(model=SimpleModel(), train_dataloader=loader, max_duration=f"{batches}ba",
                   progress_bar=False, run_name=RUN, seed=1,
                   save_folder=None if folder is None else str(folder), save_interval="1ba",
                   save_state_dict_type=fmt,
                   parallelism_config={"fsdp": {"state_dict_type": fmt}} if fsdp else None,
                   **kwargs)


def train(folder: Path, fmt: str, **kwargs: Any) -> None:
    trainer = make_trainer(folder, fmt, **kwargs)
    trainer.fit()
    trainer.close()


def tensor_spans(blob: bytes, base: int = 0) -> list[tuple[int, int]]:
    """(offset, size) of each tensor's raw bytes (``data/<n>`` records) in a torch.save zip."""
    spans = []
    with zipfile.ZipFile(io.BytesIO(blob)) as archive:
        for info in archive.infolist():
            if "/data/" in info.filename and not info.filename.endswith("serialization_id"):
                header = blob[info.header_offset:info.header_offset + 30]
                name_len = int.from_bytes(header[26:28], "little")
                extra_len = int.from_bytes(header[28:30], "little")
                start = info.header_offset + 30 + name_len + extra_len
                spans.append((base + start, info.file_size))
    return spans


def flip(path: Path, offset: int) -> None:
    """Invert 64 bytes of ``path`` at ``offset``."""
    data = bytearray(path.read_bytes())
    data[offset:offset + 64] = bytes(b ^ 0xFF for b in data[offset:offset + 64])
    path.write_bytes(bytes(data))


def shard_spans(path: Path) -> list[tuple[int, int]]:
    """Tensor-data spans (model and optimizer state) in ``path/__0_0.distcp``."""
    metadata = pickle.loads((path / ".metadata").read_bytes())  # our own file
    shard = (path / "__0_0.distcp").read_bytes()
    spans = []
    for index, info in metadata.storage_data.items():
        if index.offset is not None and info.relative_path == "__0_0.distcp":  # a tensor
            blob = shard[info.offset:info.offset + info.length]
            spans += tensor_spans(blob, base=info.offset)
    return spans


def tensors(trainer: Trainer) -> list[torch.Tensor]:
    """The model's parameters and the optimizer's state tensors."""
    out = [v.detach().clone() for v in trainer.state.model.state_dict().values()]
    for per_param in trainer.state.optimizers[0].state_dict()["state"].values():
        out += [v.clone() for v in per_param.values() if isinstance(v, torch.Tensor)]
    return out


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_flipped_bytes_are_refused_naming_the_file(tmp_path: Path, fmt: str) -> None:
    train(tmp_path / "run", fmt, batches=1)
    good = tmp_path / "run" / ("ep0-ba1-rank0.pt" if fmt == "full" else "ep0-ba1")
    reference = make_trainer(None)
    load_checkpoint(reference.state, good)
    expected = tensors(reference)
    if fmt == "full":
        spans = [s for s in tensor_spans(good.read_bytes()) if s[1] >= 128]
    else:
        spans = [s for s in shard_spans(good) if s[1] >= 128]
    assert len(spans) >= 3
    for i, (start, size) in enumerate(spans[:3]):
        copy = tmp_path / f"copy{i}" / good.name
        copy.parent.mkdir()
        if fmt == "full":
            copy.write_bytes(good.read_bytes())
            damaged = copy
        else:
            shutil.copytree(good, copy)
            damaged = copy / "__0_0.distcp"
        flip(damaged, start + (size - 64) * i // 2)  # the start, middle, end of a tensor
        with pytest.raises(CheckpointError) as info:
            make_trainer(None, load_path=str(copy))
        message = str(info.value)
        assert str(damaged) in message and "corrupt" in message and "CRC32C" in message
        assert cli_main(["convert", str(copy), "--to", "full", str(copy.parent / "o.pt")]) == 1
        # control: the same bytes, unchecked, load without a word and change the tensors
        unchecked = make_trainer(None)
        load_checkpoint(unchecked.state, copy, checksums=False)
        assert len(tensors(unchecked)) == len(expected)
        assert any(not torch.equal(a, b) for a, b in zip(expected, tensors(unchecked)))


def test_checksums_are_those_of_the_written_files(tmp_path: Path) -> None:
    """Hashed while writing, they equal a hash of the files read back; the sharded manifest
    lists every file of the directory."""
    train(tmp_path / "full", "full", batches=1)
    train(tmp_path / "sharded", "sharded", batches=1)
    full = tmp_path / "full" / "ep0-ba1-rank0.pt"
    size, crc = embedded_checksum(full)  # type: ignore[misc]
    data = bytearray(full.read_bytes()[:size])
    data[-2:] = b"\x00\x00"  # as torch.save wrote it: no zip comment
    (tmp_path / "plain.pt").write_bytes(bytes(data))
    assert file_crc32c(tmp_path / "plain.pt") == (size, crc)
    assert torch.load(full, weights_only=True)["state"]["timestamp"] is not None  # still a torch file
    sharded = tmp_path / "sharded" / "ep0-ba1"
    entries = read_manifest(sharded / "manifest.json")
    assert entries is not None
    assert set(entries) == {p.name for p in sharded.iterdir()} - {"manifest.json"}
    assert {".metadata", "extra.pt", "__0_0.distcp"} <= set(entries)
    for name, digest in entries.items():
        assert file_crc32c(sharded / name) == digest, name
    assert verify_checkpoint(full) and verify_checkpoint(sharded)


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_autoresume_falls_back_to_newest_intact(tmp_path: Path, fmt: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "run"
    train(folder, fmt, batches=3)
    suffix = "-rank0.pt" if fmt == "full" else ""
    newest = folder / f"ep0-ba3{suffix}"
    assert (folder / f"latest-{RUN}").read_text().strip() == newest.name
    damaged = newest if fmt == "full" else newest / "__0_0.distcp"
    start, size = (tensor_spans(newest.read_bytes()) if fmt == "full" else shard_spans(newest))[0]
    flip(damaged, start)
    with caplog.at_level(logging.INFO):
        resumed = make_trainer(folder, fmt, batches=4, autoresume=True)
    intact = folder / f"ep0-ba2{suffix}"
    assert int(resumed.state.timestamp.batch) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(newest) in w and "rejects" in w and str(damaged) in w for w in warnings)
    assert any(str(intact) in w and "falls back" in w for w in warnings)
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(f"Resumed from checkpoint {intact}" in m for m in infos)
    assert resumed.hyperparameters["loaded_checkpoint"] == str(intact)
    resumed.close()


def test_autoresume_refuses_when_no_checkpoint_is_intact(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    train(folder, "full", batches=2)
    for name in ("ep0-ba1-rank0.pt", "ep0-ba2-rank0.pt"):
        flip(folder / name, tensor_spans((folder / name).read_bytes())[0][0])
    with pytest.raises(CheckpointError, match="none passes its checksums") as info:
        make_trainer(folder, autoresume=True)
    assert str(folder / "ep0-ba1-rank0.pt") in str(info.value)
    assert str(folder / "ep0-ba2-rank0.pt") in str(info.value)


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_checkpoint_without_checksums_is_refused_unless_not_required(
        tmp_path: Path, fmt: str, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 25 (weak): a cadence checkpoint with its manifest / zip comment removed is
    refused by default (``require_checksums``), naming the file and the setting; with
    ``require_checksums=False`` (e.g. a file from before checksums) it loads, and says it is
    unverified."""
    train(tmp_path / "run", fmt, batches=1)
    path = tmp_path / "run" / ("ep0-ba1-rank0.pt" if fmt == "full" else "ep0-ba1")
    if fmt == "full":
        size, _ = embedded_checksum(path)  # type: ignore[misc]
        data = bytearray(path.read_bytes()[:size])
        data[-2:] = b"\x00\x00"
        path.write_bytes(bytes(data))
        assert embedded_checksum(path) is None
    else:
        (path / "manifest.json").unlink()
    with pytest.raises(CheckpointError) as info:
        make_trainer(None, load_path=str(path))
    assert str(path) in str(info.value) and "has no checksums" in str(info.value)
    assert "require_checksums: false" in str(info.value)
    with pytest.raises(CheckpointError, match="none passes its checksums"):  # autoresume too
        make_trainer(tmp_path / "run", autoresume=True, batches=2)
    with caplog.at_level(logging.WARNING):
        trainer = make_trainer(None, load_path=str(path), require_checksums=False)
    assert int(trainer.state.timestamp.batch) == 1  # loaded
    assert any(str(path) in r.getMessage() and "loads unverified" in r.getMessage()
               for r in caplog.records)


@pytest.mark.world_size(2)
def test_flipped_shard_two_ranks(tmp_path: Path) -> None:
    """Two FSDP ranks, each verifying its share of the files: both raise, naming the shard
    (no rank waits in a collective)."""
    folder = tmp_path / "two"
    train(folder, "sharded", batches=1, fsdp=True)
    path = folder / "ep0-ba1"
    dist.barrier()
    if dist.get_global_rank() == 0:
        shard = path / "__1_0.distcp"
        flip(shard, shard.stat().st_size // 2)
    dist.barrier()
    with pytest.raises(CheckpointError, match="__1_0.distcp") as info:
        load_checkpoint(make_trainer(None, "sharded", fsdp=True).state, path)
    assert "corrupt" in str(info.value)
