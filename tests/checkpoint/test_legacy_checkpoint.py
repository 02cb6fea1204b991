"""A checkpoint written by an older cadence (before the package moved to Composer's layout)
still loads and resumes bit for bit: ``fixtures/legacy-ep1-ba6.pt`` was written by
``legacy_run.py`` at main 62650c9, stopped after batch 6 of 8."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from cadence.checkpoint.errors import CheckpointError
from tests.checkpoint.legacy_run import SAVED_AT, run

FIXTURE = Path(__file__).parent / "fixtures" / "legacy-ep1-ba6.pt"


def test_legacy_checkpoint_resumes_bit_exact(tmp_path: Path) -> None:
    uninterrupted, straight = run(tmp_path / "straight")
    copy = tmp_path / "legacy.pt"
    shutil.copyfile(FIXTURE, copy)  # the fixture stays untouched
    resumed_losses, resumed = run(tmp_path / "resumed", load_path=str(copy))

    assert sorted(resumed_losses) == [SAVED_AT + 1, SAVED_AT + 2]
    assert resumed_losses == {k: uninterrupted[k] for k in resumed_losses}
    a, b = straight.state.model.state_dict(), resumed.state.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_legacy_checkpoint_with_a_flipped_byte_is_refused(tmp_path: Path) -> None:
    data = bytearray(FIXTURE.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "legacy.pt"
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        run(tmp_path / "run", load_path=str(bad))
