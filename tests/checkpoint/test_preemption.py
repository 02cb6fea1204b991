"""Checkpoint on a signal (issue 24, item 1): real ``cadence train`` / ``cadence launch``
processes signalled at a known batch stop there, save a checkpoint, exit ``128 + signal``,
and an autoresumed relaunch gives the uninterrupted loss curve with no batch trained twice.

A run reaches batch ``k``, writes a marker (``rank<r>-ba<k>``, holding its PID) and waits for
a ``go`` file; the test signals the process (or one rank), then writes ``go``, so the signal is
always handled before that batch's boundary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from cadence import Callback, State
from cadence.checkpoint.files import is_complete

REPO = Path(__file__).resolve().parents[2]
RUN = "preempted"
TOTAL = 8
WAIT_S = 60.0


class HoldAt(Callback):
    """At ``BATCH_END`` of batch ``batch`` (first time only): write ``rank<r>-ba<batch>`` (its
    PID inside) to ``marker_dir``, then wait (at most 60 s) for ``marker_dir/go``. With
    ``slow_save_s``: every save from that batch on sleeps that long before its rename into
    place, after writing ``saving`` (a save that cannot finish in time)."""

    def __init__(self, marker_dir: str, batch: int, slow_save_s: float = 0.0) -> None:
        self.dir, self.batch, self.slow = Path(marker_dir), int(batch), float(slow_save_s)

    def batch_end(self, state: State, logger: Any) -> None:
        from cadence.utils import dist

        marker = self.dir / f"rank{dist.get_global_rank()}-ba{self.batch}"
        if int(state.timestamp.batch) != self.batch or marker.exists():
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.slow:
            _slow_saves(self.dir, self.slow)
        marker.write_text(str(os.getpid()))
        end = time.monotonic() + WAIT_S
        while not (self.dir / "go").exists() and time.monotonic() < end:
            time.sleep(0.02)


def _slow_saves(marker_dir: Path, seconds: float) -> None:
    """Make the checkpoint module's rename of a finished temporary sleep first."""
    import cadence.checkpoint.checkpoint as module

    class SlowReplace:
        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        @staticmethod
        def replace(src: Any, dst: Any) -> None:
            if ".tmp-" in os.fspath(src):
                (marker_dir / "saving").write_text("")
                time.sleep(seconds)
            os.replace(src, dst)

    module.os = SlowReplace()  # type: ignore[assignment]


def run_file(tmp_path: Path, name: str, hold: Optional[dict[str, Any]] = None,
             **extra: Any) -> Path:
    config: dict[str, Any] = {
        "run_name": RUN, "seed": 17, "max_duration": f"{TOTAL}ba",
        "global_train_batch_size": 4, "log_interval": "1ba", "progress_bar": False,
        "device": "cpu",
        "model": {"name": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 512,
                  "max_seq_len": 32, "dropout": 0.1},
        "train_loader": {"name": "shakespeare", "split": "train", "seq_len": 32,
                         "vocab_size": 512, "max_samples": 32},
        "optimizer": {"name": "adamw", "lr": 3.0e-3},
        "loggers": {"file": {}},
        "save_folder": str(tmp_path / name), "save_interval": "2ba", "autoresume": True,
        **extra,
    }
    if hold is not None:
        config["callbacks"] = {"tests.checkpoint.test_preemption.HoldAt": hold}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start(config: Path, ranks: int = 1, env: Optional[dict[str, str]] = None
          ) -> subprocess.Popen[str]:
    environ = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
               "CADENCE_CACHE_DIR": os.environ["CADENCE_CACHE_DIR"], **(env or {})}
    command = ["train"] if ranks == 1 else ["launch", "-n", str(ranks)]
    return subprocess.Popen([sys.executable, "-m", "cadence", *command, str(config)], cwd=REPO,
                            env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    end = time.monotonic() + 180
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before {path.name}:\n"
                                 f"{proc.communicate()[0][-3000:]}")
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)
    time.sleep(0.05)  # its content written


def signal_at(markers: Path, proc: subprocess.Popen[str], sig: int, batch: int,
              rank: int = 0, ranks: int = 1) -> float:
    """Wait until every rank holds at ``batch``, signal ``rank``, release; the signal time."""
    for r in range(ranks):
        wait_for(markers / f"rank{r}-ba{batch}", proc)
    pid = int((markers / f"rank{rank}-ba{batch}").read_text())
    sent = time.monotonic()
    os.kill(pid, sig)
    time.sleep(0.2)
    (markers / "go").write_text("")
    return sent


def steps(folder: Path) -> list[tuple[int, float]]:
    """Every logged (step, training loss), in order, repeats included."""
    return [(r["step"], r["loss/train/total"]) for r in
            map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())
            if "loss/train/total" in r]


def latest(folder: Path) -> str:
    name = (folder / f"latest-{RUN}").read_text().strip()
    assert is_complete(folder / name), name
    return name


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, float]]:
    tmp_path = tmp_path_factory.mktemp("reference")
    code, out = finish(start(run_file(tmp_path, "reference")))
    assert code == 0, out[-3000:]
    curve = steps(tmp_path / "reference")
    assert [s for s, _ in curve] == list(range(1, TOTAL + 1))
    return curve


@pytest.mark.parametrize("save_async", [False, True], ids=["sync", "async"])
def test_sigterm_saves_at_the_batch_reached_and_resumes_exactly(
        tmp_path: Path, reference: list[tuple[int, float]], save_async: bool) -> None:
    markers, folder = tmp_path / "markers", tmp_path / "run"
    config = run_file(tmp_path, "run", {"marker_dir": str(markers), "batch": 3},
                      save_async=save_async)
    proc = start(config)
    sent = signal_at(markers, proc, signal.SIGTERM, 3)
    code, out = finish(proc)
    took = time.monotonic() - sent
    assert code == 143, out[-3000:]
    print(f"SIGTERM to exit: {took:.2f}s (save_async={save_async})")
    assert latest(folder) == "ep0-ba3-rank0.pt"  # the batch reached, not the interval's batch 2
    assert not list(folder.glob("*.tmp-*"))
    assert "Preempted by SIGTERM" in out

    code, out = finish(start(config))  # the same command: autoresume
    assert code == 0, out[-3000:]
    got = steps(folder)
    assert [s for s, _ in got] == list(range(1, TOTAL + 1))  # no batch trained twice
    assert got == reference  # bit for bit


def test_requeue_under_slurm_and_a_second_signal_during_the_save(tmp_path: Path) -> None:
    """SIGUSR1 (SLURM's warning), then SIGTERM while the checkpoint is being written: the
    save completes, the exit status is SIGUSR1's (138), and the fake ``scontrol`` records
    one requeue of the job."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol-calls"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    (bin_dir / "scontrol").chmod(0o755)
    markers, folder = tmp_path / "markers", tmp_path / "run"
    config = run_file(tmp_path, "run", {"marker_dir": str(markers), "batch": 3,
                                        "slow_save_s": 2.0}, requeue=True)
    proc = start(config, env={"PATH": f"{bin_dir}:{os.environ['PATH']}",
                              "SLURM_JOB_ID": "4242"})
    signal_at(markers, proc, signal.SIGUSR1, 3)
    wait_for(markers / "saving", proc)
    proc.send_signal(signal.SIGTERM)  # ignored: the save goes on
    code, out = finish(proc)
    assert code == 138, out[-3000:]
    assert latest(folder) == "ep0-ba3-rank0.pt"
    assert "while stopping for SIGUSR1: ignored" in out
    assert calls.read_text().splitlines() == ["requeue 4242"]


def test_a_save_past_the_timeout_leaves_the_previous_checkpoint_newest(tmp_path: Path) -> None:
    markers, folder = tmp_path / "markers", tmp_path / "run"
    config = run_file(tmp_path, "run", {"marker_dir": str(markers), "batch": 3,
                                        "slow_save_s": 30.0}, preemption_timeout=1.5)
    proc = start(config)
    sent = signal_at(markers, proc, signal.SIGTERM, 3)
    code, out = finish(proc)
    took = time.monotonic() - sent
    assert code == 143, out[-3000:]
    assert took < 10, took
    assert "preemption_timeout (1.5s) ran out before the checkpoint was saved" in out
    assert latest(folder) == "ep0-ba2-rank0.pt"
    assert not (folder / "ep0-ba3-rank0.pt").exists()
    assert not list(folder.glob("*.tmp-*"))  # the unfinished save's temporary removed


@pytest.mark.slow
def test_launch_two_ranks_signal_to_one_rank_only(tmp_path: Path) -> None:
    """SIGUSR1 to rank 1 alone: both ranks stop at the same batch (one all-reduce per
    batch), the checkpoint is at that batch, the launch exits 138; the relaunch ends the
    run. (Two ranks split the batch: the curve is compared between 2-rank runs' steps.)"""
    markers, folder = tmp_path / "markers", tmp_path / "run"
    config = run_file(tmp_path, "run", {"marker_dir": str(markers), "batch": 3})
    proc = start(config, ranks=2)
    signal_at(markers, proc, signal.SIGUSR1, 3, rank=1, ranks=2)
    code, out = finish(proc, timeout=300)
    assert code == 138, out[-3000:]
    assert latest(folder) == "ep0-ba3-rank0.pt"
    code, out = finish(start(config, ranks=2), timeout=300)
    assert code == 0, out[-3000:]
    assert [s for s, _ in steps(folder)] == list(range(1, TOTAL + 1))


class _SignalDuringEval(Callback):
    """Sends this process ``SIGUSR1`` at the second eval batch of train batch 2; counts the
    eval batches that start."""

    def __init__(self) -> None:
        self.eval_batches: dict[int, int] = {}

    def eval_batch_start(self, state: State, logger: Any) -> None:
        step = int(state.timestamp.batch)
        self.eval_batches[step] = self.eval_batches.get(step, 0) + 1
        if step == 2 and self.eval_batches[step] == 2:
            os.kill(os.getpid(), signal.SIGUSR1)


def test_a_signal_during_a_long_evaluation_stops_it_at_a_batch_boundary(tmp_path: Path) -> None:
    """The evaluation stops at its next batch boundary (not after its last batch, which
    may be past ``preemption_timeout``); the batches trained are saved, then ``Preempted``."""
    from cadence import Trainer
    from cadence.trainer.preemption import Preempted
    from tests.common.models import SimpleModel, make_dataloader

    watcher = _SignalDuringEval()
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(4),
                      eval_dataloader=make_dataloader(6, seed=1), eval_interval="1ba",
                      max_duration="4ba", save_folder=str(tmp_path), save_interval="10ba",
                      preemption_signals=["SIGUSR1"], callbacks=[watcher], progress_bar=False,
                      seed=0)
    with pytest.raises(Preempted) as info:
        trainer.fit()
    assert info.value.exit_code == 128 + signal.SIGUSR1
    assert watcher.eval_batches == {1: 6, 2: 2}  # the second pass stopped at its boundary
    assert info.value.checkpoint is not None and "ba2" in info.value.checkpoint
    assert is_complete(Path(info.value.checkpoint))
