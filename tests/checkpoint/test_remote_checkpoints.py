"""Checkpoints in object storage, against a local S3 server (moto on 127.0.0.1, s3fs pointed
at it through ``AWS_ENDPOINT_URL``; ``tests/common/s3_server.py``): full and sharded saves
(also asynchronous) resume bit-exactly from the bucket and rotate there; a checkpoint without
its completion marker, or with a flipped byte, is never loaded; a ``cadence train`` SIGKILLed
in the middle of an upload resumes, bit for bit, from the previous complete checkpoint; a
sharded checkpoint of 2 FSDP ranks loads on 1 and converts with ``cadence convert``; the lock
object refuses a live run and takes over a dead one; a missing filesystem names the extra."""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader

from cadence import Trainer, dist
from cadence.cli import main as cadence_main
from cadence.checkpoint import CheckpointError
from cadence.checkpoint.export import load_full_state
from cadence.checkpoint.lock import STALE_SECONDS, SaveFolderInUse, acquire_remote_lock
from cadence.checkpoint.remote import COMPLETE_SUFFIX, get_filesystem, stage_dir
from cadence.config.load import ConfigError, load_config
from cadence.loggers import InMemoryLogger
from tests.common.distributed import run_in_processes
from tests.common.models import SimpleModel, make_dataloader
from tests.common.s3_server import s3_bucket, s3_folder, s3_ls  # noqa: F401 - fixtures
from tests.checkpoint.test_kill_resume import (
    LATEST, REPO, RUN, TOTAL, finish, launch, loss_curve, run_file,
)

pytest.importorskip("s3fs")


def _fs() -> Any:
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    return fs


def _key(url: str) -> str:
    return url.split("://", 1)[1]


def _train(folder: str, duration: str, fmt: str = "full", save_async: bool = False,
           keep: int = -1, fit: bool = True, **kwargs: Any) -> tuple[Trainer, dict[int, float]]:
    torch.manual_seed(0)
    data = make_dataloader(num_batches=6, batch_size=4).dataset
    loader = DataLoader(data, batch_size=4 // dist.get_world_size(),
                        sampler=dist.get_sampler(data, shuffle=True))
    memory = InMemoryLogger()
    trainer = Trainer(model=SimpleModel(), train_dataloader=loader, max_duration=duration,
                      progress_bar=False, run_name="remote", seed=2, save_folder=folder,
                      save_interval="2ba", save_state_dict_type=fmt, save_async=save_async,
                      save_num_checkpoints_to_keep=keep, loggers=[memory], log_interval="1ba",
                      **kwargs)
    try:
        if fit:
            trainer.fit()
    finally:
        trainer.close()
    if "loss/train/total" not in memory.data:  # nothing left to train
        return trainer, {}
    return trainer, dict(zip(*memory.steps_and_values("loss/train/total")))


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return get_model_state_dict(trainer.state.model, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_keep_zero_in_a_remote_folder_keeps_every_checkpoint_in_the_bucket(
        s3_folder: str, tmp_path: Path) -> None:
    """Composer's save_num_checkpoints_to_keep=0 with a remote save_folder: no local copies,
    every checkpoint uploaded and kept (its docs' s3 examples); autoresume resumes from it."""
    _, first = _train(s3_folder, "4ba", keep=0)
    names = ["ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt"]
    assert s3_ls(s3_folder) == sorted([*names, *(n + COMPLETE_SUFFIX for n in names),
                                       "latest-remote"])
    resumed, _ = _train(s3_folder, "6ba", keep=0, autoresume=True)
    assert resumed.hyperparameters["loaded_checkpoint"] == f"{s3_folder}/ep0-ba4-rank0.pt"
    names.append("ep0-ba6-rank0.pt")
    assert s3_ls(s3_folder) == sorted([*names, *(n + COMPLETE_SUFFIX for n in names),
                                       "latest-remote"])


@pytest.mark.parametrize("fmt,save_async", [("full", False), ("sharded", False),
                                            ("sharded", True)],
                         ids=["full", "sharded", "sharded-async"])
def test_save_rotate_and_autoresume_bit_exact(s3_folder: str, tmp_path: Path, fmt: str,
                                              save_async: bool) -> None:
    reference, expected = _train(str(tmp_path / "local"), "6ba", fmt)
    _, first = _train(s3_folder, "4ba", fmt, save_async, keep=2)
    suffix = "-rank0.pt" if fmt == "full" else ""
    names = [f"ep0-ba2{suffix}", f"ep0-ba4{suffix}"]
    assert s3_ls(s3_folder) == sorted([*names, *(n + COMPLETE_SUFFIX for n in names),
                                       "latest-remote"])  # no lock object left behind
    resumed, second = _train(s3_folder, "6ba", fmt, save_async, keep=2, autoresume=True)
    assert resumed.hyperparameters["loaded_checkpoint"] == f"{s3_folder}/ep0-ba4{suffix}"
    assert {**first, **second} == expected  # every step's loss, bit for bit
    _assert_same(_weights(resumed), _weights(reference))
    # rotation kept exactly 2 in the bucket; the pointer names the newest
    names = [f"ep0-ba4{suffix}", f"ep0-ba6{suffix}"]
    assert s3_ls(s3_folder) == sorted([*names, *(n + COMPLETE_SUFFIX for n in names),
                                       "latest-remote"])
    assert _fs().cat_file(_key(f"{s3_folder}/latest-remote")) == f"{names[1]}\n".encode()
    stage = stage_dir(s3_folder)  # staged copies are gone once uploaded
    assert not [p for p in stage.iterdir() if p.name.startswith("ep")]


def test_unmarked_or_corrupt_checkpoint_is_never_loaded(s3_folder: str, tmp_path: Path,
                                                        caplog: Any) -> None:
    reference, expected = _train(str(tmp_path / "local"), "6ba", "sharded")
    _train(s3_folder, "6ba", "sharded")
    fs = _fs()
    shard = _key(f"{s3_folder}/ep0-ba6/__0_0.distcp")
    data = bytearray(fs.cat_file(shard))
    data[len(data) // 2] ^= 0x01
    fs.pipe_file(shard, bytes(data))  # one flipped bit in the bucket
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp.*(corrupt|CRC32C)"):
        _train(str(tmp_path / "other"), "6ba", "sharded", load_path=f"{s3_folder}/ep0-ba6")
    fs.rm(_key(f"{s3_folder}/ep0-ba4{COMPLETE_SUFFIX}"))  # its marker lost
    with pytest.raises(CheckpointError, match="no completion marker"):
        _train(str(tmp_path / "other"), "6ba", "sharded", load_path=f"{s3_folder}/ep0-ba4")
    fs.rm(_key(f"{s3_folder}/ep0-ba2/__0_0.distcp"))  # and ba2 unmarked, a shard missing
    fs.rm(_key(f"{s3_folder}/ep0-ba2{COMPLETE_SUFFIX}"))
    # autoresume: the pointer's ba6 fails its checksum; ba4 has no marker but verifies: it is
    # complete, its marker is rewritten and it is resumed from; ba2 fails: kept, not used
    with caplog.at_level(logging.WARNING):
        resumed, losses = _train(s3_folder, "6ba", "sharded", autoresume=True)
    assert resumed.hyperparameters["loaded_checkpoint"] == f"{s3_folder}/ep0-ba4"
    assert "__0_0.distcp" in caplog.text
    assert f"{s3_folder}/ep0-ba4 had no completion marker, but every file passes" in caplog.text
    assert f"{s3_folder}/ep0-ba2 has no completion marker and fails its checks" in caplog.text
    assert losses == {k: v for k, v in expected.items() if k > 4}
    _assert_same(_weights(resumed), _weights(reference))
    assert f"ep0-ba4{COMPLETE_SUFFIX}" in s3_ls(s3_folder)  # its marker rewritten
    assert "ep0-ba2" in s3_ls(s3_folder)  # the incomplete one is kept, not deleted
    # the rejected ba6 was moved aside in the bucket (never deleted), its bad bit with it,
    # and the resumed run's own ba6 took its name
    assert "moved aside, not deleted" in caplog.text
    aside = [n for n in s3_ls(s3_folder) if n.startswith("ep0-ba6.rejected-")]
    assert len(aside) == 1 and f"ep0-ba6{COMPLETE_SUFFIX}" in s3_ls(s3_folder)
    assert bytes(fs.cat_file(_key(f"{s3_folder}/{aside[0]}/__0_0.distcp"))) == bytes(data)


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_deleted_markers_never_destroy_good_checkpoints(s3_folder: str, tmp_path: Path,
                                                        fmt: str, caplog: Any) -> None:
    """Issue 25, item 3: every completion marker deleted, the pointer naming the newest:
    autoresume verifies the unmarked checkpoints, rewrites their markers (WARNING) and resumes
    from the newest; nothing is deleted. A run that does not resume is refused at the save
    whose name is taken, as for a marked checkpoint, and deletes nothing either."""
    reference, expected = _train(str(tmp_path / "local"), "6ba", fmt)
    _train(s3_folder, "4ba", fmt)
    fs = _fs()
    suffix = "-rank0.pt" if fmt == "full" else ""
    names = [f"ep0-ba2{suffix}", f"ep0-ba4{suffix}"]
    for name in names:
        fs.rm(_key(f"{s3_folder}/{name}{COMPLETE_SUFFIX}"))
    assert not [n for n in s3_ls(s3_folder) if n.endswith(COMPLETE_SUFFIX)]
    with pytest.raises(FileExistsError, match=f"ep0-ba2{suffix} already exists"):
        _train(s3_folder, "6ba", fmt)  # not resuming: its first save's name is taken
    assert set(names) <= set(s3_ls(s3_folder))  # nothing deleted
    with caplog.at_level(logging.INFO):
        resumed, losses = _train(s3_folder, "6ba", fmt, autoresume=True)
    assert resumed.hyperparameters["loaded_checkpoint"] == f"{s3_folder}/ep0-ba4{suffix}"
    assert losses == {k: v for k, v in expected.items() if k > 4}
    _assert_same(_weights(resumed), _weights(reference))
    rewritten = [r for r in caplog.records if "had no completion marker" in r.getMessage()]
    assert len(rewritten) == 2 and all(r.levelno == logging.WARNING for r in rewritten)
    assert not [r for r in caplog.records if "Removing" in r.getMessage()]
    listing = s3_ls(s3_folder)
    assert all(n in listing and n + COMPLETE_SUFFIX in listing for n in names)


def test_sigkill_mid_upload_then_autoresume_bit_exact(s3_folder: str, tmp_path: Path) -> None:
    """A real ``cadence train`` (sharded) SIGKILLed half way through an upload; relaunched,
    it takes over its lock, replaces the partial upload and ends with the uninterrupted
    run's loss curve."""
    kill = {"marker_dir": str(tmp_path / "markers"), "during_upload": [6]}
    reference = launch(run_file(tmp_path, "reference", None))  # uninterrupted, local
    config = run_file(tmp_path, "killed", kill)
    doc = yaml.safe_load(config.read_text())
    doc.update(save_folder=s3_folder, save_state_dict_type="sharded")
    config.write_text(yaml.safe_dump(doc))
    fs = _fs()

    code, out = finish(launch(config))  # killed in batch 6's upload, one file sent
    assert code == -9, out[-3000:]
    fs.invalidate_cache()
    assert fs.cat_file(_key(f"{s3_folder}/{LATEST}")) == b"ep0-ba4\n"
    assert "ep0-ba6" in s3_ls(s3_folder) and f"ep0-ba6{COMPLETE_SUFFIX}" not in s3_ls(s3_folder)
    assert len(s3_ls(f"{s3_folder}/ep0-ba6")) == 1  # the partial upload, never taken
    code, out = finish(launch(config))  # the same command runs to the end
    assert code == 0, out[-3000:]
    fs.invalidate_cache()
    assert fs.cat_file(_key(f"{s3_folder}/{LATEST}")) == f"ep1-ba{TOTAL}\n".encode()
    assert f"ep0-ba6{COMPLETE_SUFFIX}" in s3_ls(s3_folder)  # the partial one replaced

    code, out = finish(reference)
    assert code == 0, out[-3000:]
    expected = loss_curve(tmp_path / "reference")
    metrics = tmp_path / "bucket-metrics"
    metrics.mkdir()
    fs.get_file(_key(f"{s3_folder}/metrics.jsonl"), str(metrics / "metrics.jsonl"))
    assert sorted(expected) == list(range(1, TOTAL + 1))
    assert loss_curve(metrics) == expected  # the bucket's log, bit-identical every step
    assert "cadence.lock" not in s3_ls(s3_folder)
    state = load_full_state(Path(tmp_path / "reference" / f"ep1-ba{TOTAL}-rank0.pt"))
    assert state["metadata"]["run_name"] == RUN


def _save_on_two_ranks(folder: str, out: str) -> None:
    """(2 FSDP ranks) train 4 batches, save sharded into ``folder``; rank 0 keeps the
    weights in ``out``."""
    trainer, _ = _train(folder, "4ba", "sharded", parallelism_config={"fsdp": {}})
    weights = _weights(trainer)
    if dist.get_global_rank() == 0:
        torch.save(weights, Path(out) / "two_ranks.pt")


def test_elastic_two_ranks_to_one_and_convert_from_the_bucket(s3_folder: str,
                                                              tmp_path: Path) -> None:
    run_in_processes(2, __file__, "_save_on_two_ranks", {"folder": s3_folder,
                                                          "out": str(tmp_path)})
    saved = torch.load(tmp_path / "two_ranks.pt", weights_only=True)
    assert len(s3_ls(f"{s3_folder}/ep0-ba4")) >= 4  # 2 ranks' shards, .metadata, extra...
    # one rank; the run is finished (fit() would raise Composer's "No training would occur")
    resumed, losses = _train(s3_folder, "4ba", "sharded", autoresume=True, fit=False)
    assert resumed.hyperparameters["loaded_checkpoint"] == f"{s3_folder}/ep0-ba4"
    assert losses == {}
    _assert_same(_weights(resumed), saved)

    out = tmp_path / "one.pt"
    assert cadence_main(["convert", f"{s3_folder}/ep0-ba4", "--to", "full", str(out)]) == 0
    converted = load_full_state(out)
    assert converted["metadata"]["world_size"] == 2
    _assert_same(converted["model"], saved)
    exported = f"{s3_folder}/exported/one.pt"  # and into the bucket
    assert cadence_main(["convert", f"{s3_folder}/ep0-ba4", "--to", "full", exported]) == 0
    _fs().get_file(_key(exported), str(tmp_path / "back.pt"))
    _assert_same(load_full_state(tmp_path / "back.pt")["model"], saved)


def test_lock_object_refuses_a_live_run_and_takes_over_a_dead_one(s3_folder: str,
                                                                   caplog: Any) -> None:
    fs = _fs()
    key = _key(f"{s3_folder}/cadence.lock")
    other = {"host": "node-17", "pid": 4242, "run_name": "first", "started": "earlier",
             "token": "abc", "heartbeat": time.time()}
    fs.pipe_file(key, json.dumps(other).encode())
    with pytest.raises(SaveFolderInUse, match=r"run 'first' \(host node-17, pid 4242.*heartbeat"):
        acquire_remote_lock(s3_folder, "second")
    other["heartbeat"] = time.time() - STALE_SECONDS - 1  # its run stopped beating
    fs.pipe_file(key, json.dumps(other).encode())
    with caplog.at_level(logging.WARNING):
        lock = acquire_remote_lock(s3_folder, "second")
    assert "Taking over the lock" in caplog.text and "node-17" in caplog.text
    holder = json.loads(_fs().cat_file(key))
    assert holder["run_name"] == "second" and holder["host"] == socket.gethostname()
    with pytest.raises(SaveFolderInUse, match="second"):  # a third run, while it lives
        _second_process_lock(s3_folder)
    lock.release()
    assert "cadence.lock" not in s3_ls(s3_folder)


def _second_process_lock(url: str) -> None:
    """What another process on this host sees: the lock names a live PID (this one)."""
    from cadence.checkpoint import lock

    held = lock._HELD.pop(url)  # as if this process did not hold it itself
    try:
        acquire_remote_lock(url, "third")
    finally:
        lock._HELD[url] = held


def test_missing_filesystem_names_the_extra(s3_bucket: str, tmp_path: Path) -> None:
    pytest.importorskip("s3fs")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match=r"pip install 'cadence\[gcs\]'"):
            get_filesystem("gs://bucket/runs/x")
    with pytest.raises(ValueError, match="Protocol not known.*give a local path"):
        get_filesystem("nosuchproto://bucket/runs/x")
    with pytest.raises(ValueError, match=r"nosuchproto.*local path"):
        Trainer(model=SimpleModel(), train_dataloader=make_dataloader(), max_duration="1ba",
                save_folder="nosuchproto://bucket/runs/x", progress_bar=False)
    with pytest.raises(ValueError, match="credentials"):
        get_filesystem(f"s3://key:secret@{s3_bucket[5:]}/x")
    # the run file is checked before anything is built, naming the key and the fix
    with pytest.raises(ConfigError, match=r"save_folder.*nosuchproto.*local path"):
        load_config(REPO / "yamls" / "quickstart.yaml", ["save_folder=nosuchproto://b/x"])
    with pytest.raises(ConfigError, match=r"load_path.*nosuchproto"):
        load_config(REPO / "yamls" / "quickstart.yaml", ["load_path=nosuchproto://b/x/ep1"])
    load_config(REPO / "yamls" / "quickstart.yaml", [f"save_folder={s3_bucket}/runs/x"])
