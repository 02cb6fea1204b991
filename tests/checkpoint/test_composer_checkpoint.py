"""A checkpoint written by Composer 0.32.1's own Trainer resumes in cadence to the losses
Composer computes (``fixtures/composer_0_32_1``, made by its ``make_checkpoint.py``), and its
pickles are read without running code: anything beyond the listed classes is refused."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from cadence import Callback, Trainer
from cadence.checkpoint.checkpoint import read_metadata
from cadence.checkpoint.errors import CheckpointError
from cadence.utils.rng import get_rng_state
from cadence.models import ComposerClassifier
from cadence.optim import LinearWithWarmupScheduler

FIXTURES = Path(__file__).parents[1] / "fixtures" / "composer_0_32_1"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
CHECKPOINT = FIXTURES / EXPECTED["checkpoint"]


def _script() -> Any:
    """make_checkpoint.py, for the run's data and module (it imports no Composer at load)."""
    spec = importlib.util.spec_from_file_location("make_composer_checkpoint",
                                                  FIXTURES / "make_checkpoint.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Losses(Callback):
    def __init__(self) -> None:
        self.losses: dict[int, float] = {}
        self.rng_after_load: Any = None

    def after_load(self, state: Any, logger: Any) -> None:
        self.rng_after_load = get_rng_state()

    def after_loss(self, state: Any, logger: Any) -> None:
        self.losses[int(state.timestamp.batch) + 1] = float(state.loss.detach())


def _trainer(tmp_path: Path, load_path: Path, **kwargs: Any) -> tuple[Trainer, Losses]:
    script = _script()
    x, y = script.data()
    loader = DataLoader(TensorDataset(x, y), batch_size=script.BATCH, shuffle=False)
    model = ComposerClassifier(script.module(), num_classes=script.CLASSES)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    losses = Losses()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="8ba",
                      optimizers=optimizer,
                      schedulers=LinearWithWarmupScheduler(t_warmup="2ba", alpha_f=0.1),
                      seed=script.SEED, device="cpu", callbacks=[losses], progress_bar=False,
                      load_path=str(load_path), save_folder=str(tmp_path / "run"),
                      save_interval="1ep", **kwargs)
    return trainer, losses


def test_composer_checkpoint_resumes_to_composers_losses(tmp_path: Path) -> None:
    copy = tmp_path / CHECKPOINT.name
    shutil.copyfile(CHECKPOINT, copy)  # the fixture stays untouched
    trainer, losses = _trainer(tmp_path, copy)
    state = trainer.state
    assert int(state.timestamp.batch) == EXPECTED["resumed_at_batch"]
    assert (int(state.timestamp.epoch), int(state.timestamp.batch_in_epoch)) == (1, 2)
    saved = torch.load(copy, weights_only=False)  # the test's own read, for comparison
    assert state.optimizers[0].param_groups[0]["lr"] == pytest.approx(
        saved["state"]["optimizers"]["AdamW"]["param_groups"][0]["lr"])
    # the RNG as Composer left it: python, numpy and torch generators
    rng, theirs = losses.rng_after_load, saved["rng"][0]
    assert torch.equal(rng["torch"], theirs["torch"])
    assert rng["python"][1] == list(theirs["python"][1])
    assert np.array_equal(rng["numpy"][1].numpy().astype(np.uint32), theirs["numpy"][1])
    trainer.fit()
    trainer.close()
    expected = {int(k): v for k, v in EXPECTED["resumed_losses"].items()}
    assert sorted(losses.losses) == sorted(expected) == [7, 8]
    for batch, loss in expected.items():  # 7: weights + data position; 8: AdamW + schedule
        assert losses.losses[batch] == pytest.approx(loss, rel=1e-5, abs=1e-6), batch


def test_composer_checkpoint_metadata_reads(tmp_path: Path) -> None:
    meta = read_metadata(CHECKPOINT)
    assert meta["composer_version"] == "0.32.1" and meta["world_size"] == 1


class _Hostile:
    """Pickles as a call of ``os.system``: loading it unsafely would run a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def test_a_composer_checkpoint_with_another_class_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    loaded = torch.load(CHECKPOINT, weights_only=False)
    loaded["state"]["callbacks"]["Evil"] = {"payload": _Hostile(marker)}
    bad = tmp_path / "ep1-ba6-rank0.pt"
    torch.save(loaded, bad)
    with pytest.raises(CheckpointError) as info:
        _trainer(tmp_path, bad)
    message = str(info.value)
    assert str(bad) in message and "system" in message  # the file and the class named
    assert not marker.exists()  # nothing ran


def test_a_numpy_object_array_is_refused(tmp_path: Path) -> None:
    """numpy arrays are admitted for the RNG key only as numbers: an object array could carry
    any pickled object."""
    loaded = torch.load(CHECKPOINT, weights_only=False)
    loaded["rng"][0]["numpy"] = ("MT19937", np.array([1, "x"], dtype=object), 0, 0, 0.0)
    bad = tmp_path / "objects.pt"
    torch.save(loaded, bad)
    with pytest.raises(CheckpointError, match=str(bad)):
        _trainer(tmp_path, bad)


def test_pickled_composer_timestamp_maps_to_cadences(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A Composer ``Timestamp`` pickled as an object (``Time`` counters, ``TimeUnit`` enums,
    ``timedelta`` clocks) is read through the stand-ins into cadence's timestamp, without
    Composer installed."""
    import datetime
    import enum
    import sys
    import types

    from cadence.checkpoint.checkpoint import load_verified

    module = types.ModuleType("composer.core.time")

    class TimeUnit(enum.Enum):
        EPOCH, BATCH, SAMPLE = "ep", "ba", "sp"

    class Time:
        def __init__(self, value: int, unit: TimeUnit) -> None:
            self._value, self._unit = value, unit

    class Timestamp:
        def __init__(self) -> None:
            self._epoch, self._batch = Time(1, TimeUnit.EPOCH), Time(6, TimeUnit.BATCH)
            self._sample = Time(24, TimeUnit.SAMPLE)
            self._total_wct = datetime.timedelta(seconds=1.5)

    for cls in (TimeUnit, Time, Timestamp):
        cls.__module__, cls.__qualname__ = module.__name__, cls.__name__
        setattr(module, cls.__name__, cls)
    for name in ("composer", "composer.core"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    loaded = torch.load(CHECKPOINT, weights_only=False)
    loaded["state"]["timestamp"] = Timestamp()  # as Composer pickles a State attribute
    path = tmp_path / "objects.pt"
    torch.save(loaded, path)
    for name in ("composer.core.time", "composer.core", "composer"):
        monkeypatch.delitem(sys.modules, name)  # the loader must not need Composer

    flat = load_verified(path, checksums=False)
    assert {k: flat["timestamp"][k] for k in ("epoch", "batch", "sample")} == {
        "epoch": 1, "batch": 6, "sample": 24}
    assert flat["timestamp"]["total_wct"] == 1.5
