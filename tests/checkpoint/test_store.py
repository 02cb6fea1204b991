"""One storage path for checkpoints: the same rules, run through :class:`CheckpointStore`,
hold for a local folder and for one in object storage (moto's S3 server): the ``latest``
pointer (written, read, refused when garbage or outside its folder, ignored when it names
no complete checkpoint), the candidates (the pointer's first, then the run's others newest
first, set-aside ones never), move-aside (data kept), and autoresume's choice (a corrupt
newest checkpoint set aside, the previous one used, the pointer moved to it)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Trainer
from cadence.checkpoint import CheckpointError
from cadence.checkpoint.files import REJECTED_MARK, could_write, format_name, pointer_name
from cadence.checkpoint.remote import RemoteFolder
from cadence.checkpoint.store import CheckpointStore, LocalFolder
from tests.common.models import SimpleModel, make_dataloader
from tests.common.s3_server import s3_bucket, s3_folder  # noqa: F401 - fixtures

RUN = "store"
POINTER = f"latest-{RUN}"
NAMES = ["ep0-ba1-rank0.pt", "ep0-ba2-rank0.pt", "ep0-ba3-rank0.pt"]  # oldest first


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three real checkpoints of run ``store`` (batches 1-3), and one of another run."""
    made = {}
    for run, batches in ((RUN, 3), ("other", 1)):
        folder = tmp_path_factory.mktemp(run)
        torch.manual_seed(0)
        data = make_dataloader(num_batches=batches, batch_size=4).dataset
        trainer = Trainer(model=SimpleModel(), train_dataloader=DataLoader(data, batch_size=4),
                          max_duration=f"{batches}ba", progress_bar=False, run_name=run,
                          save_folder=str(folder), save_interval="1ba")
        trainer.fit()
        trainer.close()
        made.update({f"{run}:{p.name}": p for p in folder.glob("ep*.pt") if not p.is_symlink()})
    return made


Put = Callable[..., None]  # put(name, file, when, run=None)


@pytest.fixture(params=["local", "remote"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[CheckpointStore, Put]:
    """A checkpoint folder of either kind, and ``put(name, file, when)``: make ``file`` a
    complete checkpoint ``name`` written at POSIX time ``when``, as a save would."""
    if request.param == "local":
        local = LocalFolder(tmp_path / "run")
        local.folder.mkdir()

        def put_local(name: str, file: Path, when: float, run: Optional[str] = None) -> None:
            (local.folder / name).write_bytes(file.read_bytes())
            os.utime(local.folder / name, (when, when))

        return local, put_local
    pytest.importorskip("s3fs")
    remote = RemoteFolder(request.getfixturevalue("s3_folder"))

    def put_remote(name: str, file: Path, when: float, run: Optional[str] = None) -> None:
        from cadence.checkpoint import read_metadata

        remote.fs.put_file(str(file), remote._key(name))
        remote.mark_complete(name, None, run_name=run or read_metadata(file)["run_name"],
                             format="full", saved_at=when)

    return remote, put_remote


def fill(store: tuple[CheckpointStore, Put], written: dict[str, Path]) -> CheckpointStore:
    folder, put = store
    now = time.time()
    for age, name in enumerate(reversed(NAMES)):
        put(name, written[f"{RUN}:{name}"], now - 100 * (age + 1))
    put("theirs.pt", written["other:ep0-ba1-rank0.pt"], now)  # the newest, another run's
    return folder


def test_pointer_and_candidates(store: tuple[CheckpointStore, Put],
                                written: dict[str, Path]) -> None:
    folder = fill(store, written)
    assert folder.read_latest(POINTER) is None  # no pointer yet
    assert list(folder.candidates(POINTER, RUN)) == NAMES[::-1]  # newest first, own run
    assert list(folder.candidates(POINTER, None))[0] == "theirs.pt"

    folder.write_latest(POINTER, NAMES[0])
    assert folder.read_latest(POINTER) == NAMES[0]
    assert list(folder.candidates(POINTER, RUN)) == [NAMES[0], NAMES[2], NAMES[1]]
    assert folder.newest(POINTER, RUN) == NAMES[0]
    assert dict(folder.owners()) == {**{name: RUN for name in NAMES}, "theirs.pt": "other"}

    moved = folder.move_aside(NAMES[2])
    assert moved.startswith(NAMES[2] + REJECTED_MARK) and folder.exists(moved)  # kept
    assert not folder.exists(NAMES[2])
    assert list(folder.candidates(POINTER, RUN)) == [NAMES[0], NAMES[1]]

    folder.write_latest(POINTER, moved)  # a pointer at a set-aside or missing checkpoint
    assert folder.read_latest(POINTER) is None
    folder.write_latest(POINTER, "missing.pt")
    assert folder.newest(POINTER, RUN) == NAMES[1]


@pytest.mark.parametrize("content, message", [
    (b"\x00\xff\x13garbage\x80", "holds binary data"), (b"\n", "is empty"),
    (b"../elsewhere/ep0-ba1-rank0.pt\n", "outside its folder"),
    (b"/etc/hostname\n", "outside its folder"),
])
def test_garbage_pointer_is_refused(store: tuple[CheckpointStore, Put],
                                    written: dict[str, Path], content: bytes,
                                    message: str) -> None:
    folder = fill(store, written)
    folder.write_object(POINTER, content)
    with pytest.raises(CheckpointError, match=message) as info:
        folder.newest(POINTER, RUN)
    assert folder.location(POINTER) in str(info.value)


def test_corrupt_newest_is_set_aside_and_the_previous_used(
        store: tuple[CheckpointStore, Put], written: dict[str, Path], tmp_path: Path) -> None:
    folder, put = store
    fill(store, written)
    data = bytearray(written[f"{RUN}:{NAMES[2]}"].read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(bytes(data))
    put(NAMES[2], corrupt, time.time() - 50)
    folder.write_latest(POINTER, NAMES[2])

    assert folder.newest_intact(POINTER, RUN) == folder.location(NAMES[1])
    assert folder.read_latest(POINTER) == NAMES[1]  # the pointer moved to it
    assert not folder.exists(NAMES[2])
    assert list(folder.candidates(POINTER, RUN)) == [NAMES[1], NAMES[0]]


def test_none_intact_names_each_failure(store: tuple[CheckpointStore, Put],
                                        tmp_path: Path) -> None:
    folder, put = store
    assert folder.newest_intact(POINTER, RUN) is None  # an empty folder: a fresh run
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    put("junk.pt", tmp_path / "junk.pt", time.time(), RUN)
    folder.write_latest(POINTER, "junk.pt")
    with pytest.raises(CheckpointError, match="none passes its checksums") as info:
        folder.newest_intact(POINTER, RUN)
    assert folder.location("junk.pt") in str(info.value)
    assert folder.exists("junk.pt")  # nothing to fall back to: left where it is


def test_one_name_template() -> None:
    """The save name and the autoresume check's "could this run write it" share one filler."""
    template = "{run_name}-ep{epoch}-ba{batch}-rank{rank}.pt"
    name = format_name(template, run_name="a", epoch=2, batch=30, rank=0)
    assert name == "a-ep2-ba30-rank0.pt" and could_write(template, "a", name)
    assert not could_write(template, "b", name) and not could_write("{nope}", "a", name)
    with pytest.raises(ValueError, match="unknown field"):
        format_name("{nope}", run_name="a", epoch=0, batch=0)
    assert pointer_name("latest-rank{rank}.pt", "a") == "latest-a"  # Composer's symlink name
    assert pointer_name(None, "a") == "latest-a"
    assert pointer_name("latest", "a") == "latest"  # cadence's older API: the pointer itself


def test_owner_of_an_unreadable_checkpoint(tmp_path: Path) -> None:
    folder = LocalFolder(tmp_path)
    (tmp_path / "bad.pt").write_bytes(b"xx")
    assert dict(folder.owners()) == {}
    assert folder.newest("latest", "anyone") is None
    assert folder.newest("latest", None) == "bad.pt"
