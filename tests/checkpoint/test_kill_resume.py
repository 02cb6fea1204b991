"""Crash consistency: a real ``cadence train`` process SIGKILLed at several points (between
saves, in the middle of a save, between a save and its ``latest`` pointer) and relaunched
with the same command (autoresume) ends with the same loss curve, bit for bit, as a run that
was never interrupted; after every kill the ``latest`` pointer names a loadable checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import cadence.callbacks.checkpoint_saver as saver_module
from cadence import Trainer
from cadence.checkpoint.export import load_full_state
from cadence.checkpoint.files import is_complete
from tests.common.events import StopAt
from tests.common.models import SimpleModel, make_dataloader

REPO = Path(__file__).resolve().parents[2]
RUN = "killed"
LATEST = f"latest-{RUN}"
TOTAL = 12  # batches: 2 epochs of 6 (24 samples, 4 per batch)


def run_file(tmp_path: Path, name: str, kill: dict[str, Any] | None,
             **overrides: Any) -> Path:
    """A tiny GPT-2 on Shakespeare, dropout on (the RNG must resume too), a checkpoint every
    2 batches, the loss logged every batch to ``<save_folder>/metrics.jsonl``; ``overrides``
    replace top-level keys (another ``model``...)."""
    config: dict[str, Any] = {
        "run_name": RUN, "seed": 17, "max_duration": f"{TOTAL}ba",
        "global_train_batch_size": 4, "log_interval": "1ba", "progress_bar": False,
        "device": "cpu",
        "model": {"name": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 512,
                  "max_seq_len": 32, "dropout": 0.1},
        "train_loader": {"name": "shakespeare", "split": "train", "seq_len": 32,
                         "vocab_size": 512, "max_samples": 24},
        "optimizer": {"name": "adamw", "lr": 3.0e-3},
        "scheduler": {"name": "cosine_decay_with_warmup", "t_warmup": "3ba", "alpha_f": 0.1},
        "loggers": {"file": {}},
        "save_folder": str(tmp_path / name), "save_interval": "2ba", "autoresume": True,
    }
    config.update(overrides)
    if kill is not None:
        config["callbacks"] = {"tests.common.killing.KillAt": kill}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def launch(config: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           # the tokenized corpus is built once (tests/conftest.py names a session cache)
           "CADENCE_CACHE_DIR": os.environ["CADENCE_CACHE_DIR"]}
    return subprocess.Popen([sys.executable, "-m", "cadence", "train", str(config)], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=240)
    return proc.returncode, out


def loss_curve(folder: Path) -> dict[int, float]:
    """The last logged training loss of every step (a resumed run logs some steps again)."""
    curve: dict[int, float] = {}
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss/train/total" in record:
            curve[record["step"]] = record["loss/train/total"]
    return curve


def latest(folder: Path) -> tuple[str, int]:
    """The checkpoint ``latest`` names, checked complete and loadable; and its batch."""
    name = (folder / LATEST).read_text().strip()
    assert is_complete(folder / name), name
    state = load_full_state(folder / name)  # every byte read, weights_only
    assert state["metadata"]["run_name"] == RUN and "model" in state
    return name, int(state["timestamp"]["batch"])


def test_sigkill_and_autoresume_give_the_uninterrupted_loss_curve(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    kill = {"marker_dir": str(markers), "batches": [3], "during_save": [6],
            "before_pointer": [8]}
    reference = launch(run_file(tmp_path, "reference", None))  # uninterrupted, alongside
    config = run_file(tmp_path, "killed", kill)
    folder = tmp_path / "killed"

    # 1. killed at the end of batch 3: the checkpoint of batch 2 stays the latest
    code, out = finish(launch(config))
    assert code == -9, out[-3000:]
    assert latest(folder) == ("ep0-ba2-rank0.pt", 2)

    # 2. killed inside the save of batch 6, its data written, before the rename: batch 4's
    # checkpoint stays the latest; the temporary is left behind and never taken for one
    code, out = finish(launch(config))
    assert code == -9, out[-3000:]
    assert latest(folder) == ("ep0-ba4-rank0.pt", 4)
    assert not (folder / "ep0-ba6-rank0.pt").exists()
    assert [p.name.split(".tmp-")[0] for p in folder.glob("*.tmp-*")] == ["ep0-ba6-rank0.pt"]

    # 3. killed in the save of batch 8 after the rename, before the pointer moved: the
    # pointer still names batch 6; batch 8's orphan is replaced by the resumed run
    code, out = finish(launch(config))
    assert code == -9, out[-3000:]
    assert latest(folder) == ("ep0-ba6-rank0.pt", 6)
    assert is_complete(folder / "ep1-ba8-rank0.pt")

    # 4. the same command again runs to the end, printing which checkpoint it resumed from
    code, out = finish(launch(config))
    assert code == 0, out[-3000:]
    assert f"Resumed from checkpoint {folder / 'ep0-ba6-rank0.pt'}" in out  # issue 25 (weak)
    assert latest(folder) == ("ep1-ba12-rank0.pt", 12)
    assert sorted(p.name for p in markers.iterdir()) == [
        "batch_end-ba3", "before_pointer-ba8", "during_save-ba6"]

    code, out = finish(reference)
    assert code == 0, out[-3000:]
    expected, got = loss_curve(tmp_path / "reference"), loss_curve(folder)
    assert sorted(expected) == list(range(1, TOTAL + 1))
    assert got == expected  # bit-identical, every step

    # 5. relaunching the finished run is a no-op that succeeds
    before = sorted(p.name for p in folder.iterdir())
    code, out = finish(launch(config))
    assert code == 0, out[-3000:]
    assert sorted(p.name for p in folder.iterdir()) == before
    assert loss_curve(folder) == expected


# ---------------------------------------------------------------- the same, in process


def train(folder: Path, callbacks: Any = ()) -> Trainer:
    torch.manual_seed(0)
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=6),
                      max_duration="6ba", progress_bar=False, run_name=RUN, seed=2,
                      callbacks=list(callbacks), save_folder=str(folder), save_interval="2ba",
                      autoresume=True)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return trainer


def test_finished_run_relaunched_saves_nothing_and_raises_composers_error(
        tmp_path: Path) -> None:
    """In Python, fit() on a finished autoresumed run raises Composer's ValueError (the
    `cadence train` relaunch above succeeds instead, without calling fit)."""
    train(tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    with pytest.raises(ValueError, match="No training would occur"):
        train(tmp_path)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before


def test_orphan_beyond_the_pointer_is_replaced(tmp_path: Path, monkeypatch: Any) -> None:
    """A save renamed into place whose pointer update never happened (the process died in
    between): autoresume goes back to the pointer's checkpoint and overwrites the orphan."""
    reference = train(tmp_path / "reference")

    def die(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt("killed between rename and pointer")

    calls = {"n": 0}
    real = saver_module.write_latest

    def write_latest(*args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        (die if calls["n"] == 2 else real)(*args, **kwargs)  # the save of batch 4

    monkeypatch.setattr(saver_module, "write_latest", write_latest)
    folder = tmp_path / "run"
    try:
        train(folder)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the save of batch 4 should have been interrupted")
    assert (folder / LATEST).read_text().strip() == "ep0-ba2-rank0.pt"
    assert is_complete(folder / "ep0-ba4-rank0.pt")
    monkeypatch.setattr(saver_module, "write_latest", real)
    resumed = train(folder)
    assert (folder / LATEST).read_text().strip() == "ep0-ba6-rank0.pt"
    for (name, got), (_, want) in zip(resumed.state.model.state_dict().items(),
                                      reference.state.model.state_dict().items()):
        assert torch.equal(got, want), name
    # and a different run's checkpoint of the same name is still never clobbered
    other = tmp_path / "other"
    train(other, callbacks=[StopAt(2)])
    state = torch.load(other / "ep0-ba2-rank0.pt", weights_only=True)
    state["state"]["metadata"]["run_name"] = "someone-else"
    torch.save(state, other / "ep0-ba4-rank0.pt")  # sits where this run's next save goes
    try:
        train(other)
    except FileExistsError as exc:
        assert str(other / "ep0-ba4-rank0.pt") in str(exc)
    else:
        raise AssertionError("another run's checkpoint was overwritten")
