"""RemoteUploaderDownloader: background uploads with retries to a local S3 server (moto) and
to ``file://``; downloads; a real Trainer's checkpoint and metrics reach the bucket."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cadence import Trainer
from cadence.loggers import FileLogger, RemoteUploaderDownloader
from cadence.loggers.remote_uploader_downloader import is_transient
from tests.common.models import SimpleModel, make_dataloader
from tests.common.s3_server import s3_bucket, s3_folder, s3_ls  # noqa: F401


def _state(run_name: str = "run-a") -> SimpleNamespace:
    return SimpleNamespace(run_name=run_name, device=None)


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _read_s3(url: str) -> bytes:
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    return fs.cat_file(url.split("://", 1)[1])


def test_uploads_to_s3_formatted_and_downloads_back(s3_folder: str, tmp_path: Path) -> None:
    rud = RemoteUploaderDownloader(s3_folder, file_path_format_string="{run_name}/r{rank}/"
                                   "{remote_file_name}", num_concurrent_uploads=2)
    rud.init(_state(), None)
    src = _file(tmp_path, "a.txt", "first")
    rud.upload_file(_state(), "a.txt", src, overwrite=False)
    src.write_text("changed after the call")  # the copy was taken at the call
    rud.upload_file(_state(), "b.txt", _file(tmp_path, "b.txt", "second"), overwrite=False)
    rud.wait_for_workers()
    assert _read_s3(f"{s3_folder}/run-a/r0/a.txt") == b"first"
    assert _read_s3(f"{s3_folder}/run-a/r0/b.txt") == b"second"
    assert rud.get_uri_for_file("a.txt") == f"{s3_folder}/run-a/r0/a.txt"
    # rank 0 checked at INIT that the store takes writes, as Composer does
    assert "run-a" in s3_ls(s3_folder)
    assert _read_s3(f"{s3_folder}/run-a/r0/.credentials_validated_successfully")

    dest = tmp_path / "down" / "a.txt"
    rud.download_file("run-a/r0/a.txt", str(dest), progress_bar=False)
    assert dest.read_text() == "first"
    with pytest.raises(FileExistsError, match="overwrite=True"):
        rud.download_file("run-a/r0/a.txt", str(dest))
    with pytest.raises(FileNotFoundError):
        rud.download_file("run-a/r0/missing.txt", str(tmp_path / "m.txt"), progress_bar=False)
    staging = Path(rud._staging)
    rud.post_close()
    assert not staging.exists()  # its own staging folder is removed


def test_overwrite_false_refuses_existing_object(tmp_path: Path) -> None:
    store = tmp_path / "store"
    rud = RemoteUploaderDownloader(f"file://{store}", num_attempts=1)
    rud.upload_file(_state(), "x.txt", _file(tmp_path, "x.txt", "1"), overwrite=False)
    rud.wait_for_workers()
    assert (store / "x.txt").read_text() == "1"
    rud.upload_file(_state(), "x.txt", _file(tmp_path, "y.txt", "2"), overwrite=False)
    with pytest.raises(FileExistsError, match="already exists"):
        rud.wait_for_workers()
    assert (store / "x.txt").read_text() == "1"
    rud.upload_file(_state(), "x.txt", _file(tmp_path, "z.txt", "3"), overwrite=True)
    rud.wait_for_workers()
    assert (store / "x.txt").read_text() == "3"
    rud.post_close()


def test_transient_failure_is_retried_then_uploaded(s3_folder: str, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    rud = RemoteUploaderDownloader(s3_folder, num_attempts=3)
    rud.retry_backoff_s = 0.01
    fs = rud.remote_backend
    real_put, calls = fs.put_file, []

    def flaky(src: str, dst: str, **kwargs: object) -> None:
        calls.append(dst)
        if len(calls) == 1:
            raise ConnectionResetError(104, "connection reset by peer")
        real_put(src, dst, **kwargs)

    monkeypatch.setattr(fs, "put_file", flaky)
    rud.upload_file(_state(), "ckpt.pt", _file(tmp_path, "c", "weights"), overwrite=True)
    rud.wait_for_workers()
    assert len(calls) == 2
    assert "attempt 1 of 3" in caplog.text
    assert _read_s3(f"{s3_folder}/ckpt.pt") == b"weights"
    rud.post_close()


def test_persistent_failure_raised_on_training_thread(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rud = RemoteUploaderDownloader(f"file://{tmp_path / 'store'}", num_attempts=2)
    rud.retry_backoff_s = 0.0
    calls = []

    def broken(src: str, dst: str, **kwargs: object) -> None:
        calls.append(dst)
        raise TimeoutError("store unreachable")

    monkeypatch.setattr(rud.remote_backend, "put_file", broken)  # fsspec caches instances
    rud.upload_file(_state(), "a", _file(tmp_path, "a", "1"), overwrite=True)
    with pytest.raises(TimeoutError, match="unreachable"):
        rud.wait_for_workers()
    assert len(calls) == 2  # num_attempts in all
    rud.batch_end(_state(), None)  # raised once, not again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rud.post_close()
    assert not is_transient(PermissionError("denied")) and is_transient(ConnectionError())


def test_same_name_queued_twice_newest_wins(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    rud = RemoteUploaderDownloader(f"file://{store}")
    gate = threading.Event()
    real_put = rud.remote_backend.put_file

    def slow(src: str, dst: str, **kwargs: object) -> None:
        gate.wait(5)
        real_put(src, dst, **kwargs)

    monkeypatch.setattr(rud.remote_backend, "put_file", slow)
    rud.upload_file(_state(), "blocker", _file(tmp_path, "0", "0"), overwrite=True)
    rud.upload_file(_state(), "latest", _file(tmp_path, "1", "old"), overwrite=True)
    with pytest.raises(FileExistsError, match="already queued"):
        rud.upload_file(_state(), "latest", _file(tmp_path, "2", "x"), overwrite=False)
    rud.upload_file(_state(), "latest", _file(tmp_path, "3", "new"), overwrite=True)
    gate.set()
    rud.wait_for_workers()
    assert (store / "latest").read_text() == "new"
    rud.post_close()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="num_concurrent_uploads"):
        RemoteUploaderDownloader("file:///tmp/x", num_concurrent_uploads=0)
    with pytest.raises(ValueError, match="num_attempts"):
        RemoteUploaderDownloader("file:///tmp/x", num_attempts=0)
    with pytest.raises(ValueError, match="aws_secret_access_key.*environment"):
        RemoteUploaderDownloader("s3://b", backend_kwargs={"aws_secret_access_key": "x"})
    with pytest.raises(ValueError, match="nosuchproto"):
        RemoteUploaderDownloader("nosuchproto://bucket")
    rud = RemoteUploaderDownloader("s3://ignored/pre", backend_kwargs={
        "bucket": "real", "prefix": "/p/", "endpoint_url": "http://127.0.0.1:1"})
    assert rud._url == "s3://real/pre" and rud._prefix == "p"
    assert rud._storage_options == {"client_kwargs": {"endpoint_url": "http://127.0.0.1:1"}}


def test_trainer_checkpoint_and_metrics_reach_the_bucket(s3_folder: str, tmp_path: Path) -> None:
    import s3fs

    rud = RemoteUploaderDownloader(s3_folder, file_path_format_string="up/{remote_file_name}")
    model = SimpleModel()
    trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=2),
                      max_duration="2ep", optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                      loggers=[rud, FileLogger()], save_folder=str(tmp_path / "ckpt"),
                      save_interval="1ep", run_name="rud-run", progress_bar=False, device="cpu",
                      log_interval="1ba")
    trainer.fit()
    trainer.close()
    local = {p.read_bytes() for p in (tmp_path / "ckpt").rglob("*.pt") if not p.is_symlink()}
    assert len(local) == 2, "the run should save a checkpoint per epoch"
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    keys = fs.find(s3_folder.split("://", 1)[1] + "/up")
    uploaded = {fs.cat_file(k) for k in keys if k.endswith(".pt")}
    assert uploaded == local  # both checkpoints, byte for byte
    metrics = [k for k in keys if k.endswith("metrics.jsonl")]
    assert len(metrics) == 1, keys
    lines = fs.cat_file(metrics[0]).decode().splitlines()
    assert sum("loss/train/total" in line for line in lines) == 4  # the final copy: complete


def test_checkpoint_loads_back_through_download_file(tmp_path: Path) -> None:
    """Composer's ``load_checkpoint(object_store=<RemoteUploaderDownloader>)`` path."""
    from cadence.utils.checkpoint import load_checkpoint, save_checkpoint

    source = SimpleModel()
    trainer = Trainer(model=source, train_dataloader=make_dataloader(2), max_duration="1ba",
                      optimizers=torch.optim.SGD(source.parameters(), lr=0.1),
                      progress_bar=False, device="cpu", seed=0, run_name="src")
    path = save_checkpoint(trainer.state, str(tmp_path / "ck.pt"))
    rud = RemoteUploaderDownloader(f"file://{tmp_path / 'store'}")
    rud.upload_file(trainer.state, "ckpts/ck.pt", Path(path), overwrite=False)
    rud.wait_for_workers()
    rud.post_close()
    trainer.close()

    target = SimpleModel()
    other = Trainer(model=target, train_dataloader=make_dataloader(2), max_duration="1ba",
                    optimizers=torch.optim.SGD(target.parameters(), lr=0.1),
                    progress_bar=False, device="cpu", seed=1)
    load_checkpoint("ckpts/ck.pt", other.state, other.logger, object_store=rud,
                    load_weights_only=True)
    for key, value in source.state_dict().items():
        torch.testing.assert_close(target.state_dict()[key], value, rtol=0, atol=0)
    other.close()
