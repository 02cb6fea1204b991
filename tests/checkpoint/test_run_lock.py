"""One run per save folder (issue 10, item 4): a second live run is refused at start, naming
the first; a lock left by a run that died is taken over with a warning."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from cadence import Callback, State, Trainer
from cadence.checkpoint.lock import (
    LOCK_FILENAME, SaveFolderInUse, _acquire_without_locks,
)
from tests.common.models import SimpleModel, make_dataloader
from tests.checkpoint.test_kill_resume import launch

REPO = Path(__file__).resolve().parents[2]


class WaitForFile(Callback):
    """At FIT_START, writes ``ready`` and waits (at most ``timeout`` seconds) for ``go``."""

    def __init__(self, ready: str, go: str, timeout: float = 120.0) -> None:
        self.ready, self.go, self.timeout = Path(ready), Path(go), timeout

    def fit_start(self, state: State, logger: Any) -> None:
        self.ready.write_text(str(os.getpid()))
        deadline = time.monotonic() + self.timeout
        while not self.go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def run_file(tmp_path: Path, name: str, folder: Path, wait: bool) -> Path:
    """A tiny GPT-2 run with autoresume (the case that used to resume from a live run)."""
    config: dict[str, Any] = {
        "run_name": "shared", "seed": 17, "max_duration": "4ba", "global_train_batch_size": 4,
        "progress_bar": False, "device": "cpu", "log_interval": "1ba",
        "model": {"name": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 512,
                  "max_seq_len": 32},
        "train_loader": {"name": "shakespeare", "split": "train", "seq_len": 32,
                         "vocab_size": 512, "max_samples": 16},
        "loggers": {"file": {}},
        "save_folder": str(folder), "save_interval": "2ba", "autoresume": True,
    }
    if wait:
        config["callbacks"] = {"tests.checkpoint.test_run_lock.WaitForFile": {
            "ready": str(tmp_path / "ready"), "go": str(tmp_path / "go")}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, _ = proc.communicate()
            pytest.fail(f"the first run ended early ({proc.returncode}): {out}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the first run did not reach FIT_START in {timeout} s")
        time.sleep(0.05)


def test_second_live_run_is_refused_and_a_dead_runs_lock_is_taken_over(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    first = launch(run_file(tmp_path, "first", folder, wait=True))
    try:
        wait_for(tmp_path / "ready", first)
        holder = json.loads((folder / LOCK_FILENAME).read_text())
        assert holder["pid"] == first.pid and holder["host"] == socket.gethostname()

        second = launch(run_file(tmp_path, "second", folder, wait=False))
        out, _ = second.communicate(timeout=180)
        assert second.returncode == 1, out
        assert f"is in use by run 'shared' (host {holder['host']}, pid {first.pid}" in out, out
        assert "Traceback" not in out  # a message, not a crash
        assert str(folder) in out and holder["started"] in out and "another save_folder" in out
        assert not list(folder.glob("*.pt"))  # the refused run saved nothing

        first.send_signal(signal.SIGKILL)  # dies holding the lock: the file stays behind
        first.wait(timeout=30)
        assert json.loads((folder / LOCK_FILENAME).read_text())["pid"] == first.pid

        third = launch(run_file(tmp_path, "third", folder, wait=False))
        out, _ = third.communicate(timeout=180)
        assert third.returncode == 0, out
        assert "Taking over the lock" in out and f"pid {first.pid}" in out, out
        assert (folder / "latest-shared").exists()
        assert not (folder / LOCK_FILENAME).exists()  # released at the end of the run
    finally:
        (tmp_path / "go").touch()
        if first.poll() is None:
            first.kill()
        first.communicate(timeout=30)


def trainer(folder: Path, run_name: str | None = "r", **kwargs: Any) -> Trainer:
    return Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=2),
                   max_duration="2ba", save_folder=str(folder), run_name=run_name,
                   progress_bar=False, seed=0, **kwargs)


def test_lock_names_holder_and_is_released_by_close(tmp_path: Path) -> None:
    first = trainer(tmp_path)
    holder = json.loads((tmp_path / LOCK_FILENAME).read_text())
    assert holder["pid"] == os.getpid() and holder["run_name"] == "r"
    first.fit()
    first.close()
    assert not (tmp_path / LOCK_FILENAME).exists()
    first.close()  # idempotent


def test_another_process_holding_the_lock_refuses_before_anything_is_built(
        tmp_path: Path) -> None:
    holder_script = (
        "import sys, time; from pathlib import Path;"
        "from cadence.checkpoint.lock import acquire_run_lock;"
        "acquire_run_lock(Path(sys.argv[1]), 'other'); print('held', flush=True);"
        "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", holder_script, str(tmp_path)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(SaveFolderInUse) as info:
            trainer(tmp_path, save_interval="1ba")
        message = str(info.value)
        assert f"pid {proc.pid}" in message and "'other'" in message
        assert socket.gethostname() in message and str(tmp_path) in message
        assert not list(tmp_path.glob("*.pt")) and not (tmp_path / "metrics.jsonl").exists()
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    # its holder is gone: the kernel dropped the lock, the file is taken over
    trainer(tmp_path).close()
    assert not (tmp_path / LOCK_FILENAME).exists()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


def test_without_file_locks_a_dead_holder_is_taken_over_and_a_live_one_refused(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The fallback for filesystems without POSIX locks decides by the file's content."""
    path = tmp_path / LOCK_FILENAME
    pid = dead_pid()
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "run_name": "gone",
                                "started": "yesterday"}))
    with caplog.at_level(logging.WARNING, logger="cadence.checkpoint.lock"):
        lock = _acquire_without_locks(path, "mine", "t0")
    assert f"pid {pid}" in caplog.text and "Taking over" in caplog.text
    assert json.loads(path.read_text())["run_name"] == "mine"
    lock.release()
    assert not path.exists()

    path.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getppid(),
                                "run_name": "alive", "started": "now"}))
    with pytest.raises(SaveFolderInUse, match=f"pid {os.getppid()}"):
        _acquire_without_locks(path, "mine", "t1")
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "run_name": "far",
                                "started": "now"}))
    with pytest.raises(SaveFolderInUse, match="another host"):
        _acquire_without_locks(path, "mine", "t2")
    assert json.loads(path.read_text())["run_name"] == "far"  # a refusal changes nothing


class FailsAtInit(Callback):
    def init(self, state: State, logger: Any) -> None:
        raise RuntimeError("this callback fails at INIT")


def test_a_failed_init_releases_the_lock(tmp_path: Path) -> None:
    """A Trainer whose construction fails after taking the lock does not keep the folder."""
    with pytest.raises(RuntimeError, match="fails at INIT"):
        trainer(tmp_path, callbacks=[FailsAtInit()])
    assert not (tmp_path / LOCK_FILENAME).exists()
    trainer(tmp_path).close()
