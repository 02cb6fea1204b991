"""A checkpoint written by an older cadence (before the package moved to Composer's layout)
still loads and resumes bit for bit: ``fixtures/legacy-ep1-ba6.pt`` was written by
``legacy_run.py`` at main 62650c9, stopped after batch 6 of 8."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from cadence.checkpoint.errors import CheckpointError
from tests.checkpoint.legacy_run import SAVED_AT, run

FIXTURE = Path(__file__).parent / "fixtures" / "legacy-ep1-ba6.pt"


def test_legacy_checkpoint_resumes_bit_exact(tmp_path: Path) -> None:
    """Resumed from the legacy file, the run continues bit for bit as the same state does
    when today's cadence saves it again and resumes from that: the legacy load restores all of
    it (weights, optimizer, schedule, RNG, timestamp, data position). The comparison is
    between two runs on this machine: the fixture's first six batches were computed on
    another CPU, whose kernels (AVX2 or AVX-512) round differently, so against an
    uninterrupted run here the losses agree to float tolerance, not to the bit."""
    copy = tmp_path / "legacy.pt"
    shutil.copyfile(FIXTURE, copy)  # the fixture stays untouched
    resumed_losses, resumed = run(tmp_path / "resumed", load_path=str(copy))
    _, loaded = run(tmp_path / "resaved", load_path=str(copy), fit=False)
    resaved = loaded.save_checkpoint(str(tmp_path / "resaved" / "today-ep1-ba6"))
    loaded.close()
    again_losses, again = run(tmp_path / "again", load_path=resaved)

    assert sorted(resumed_losses) == [SAVED_AT + 1, SAVED_AT + 2]
    assert resumed_losses == again_losses
    a, b = again.state.model.state_dict(), resumed.state.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    uninterrupted, straight = run(tmp_path / "straight")  # same batches, schedule, dropout
    for step, loss in resumed_losses.items():
        assert loss == pytest.approx(uninterrupted[step], rel=1e-4), step
    c = straight.state.model.state_dict()  # the optimizer's moments carried over, too
    assert all(torch.allclose(b[k], c[k], rtol=1e-4, atol=1e-5) for k in c)


def test_legacy_checkpoint_with_a_flipped_byte_is_refused(tmp_path: Path) -> None:
    data = bytearray(FIXTURE.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "legacy.pt"
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        run(tmp_path / "run", load_path=str(bad))


@pytest.mark.parametrize("pointer, trainer_kwargs", [
    ("latest-legacy", {}),  # the pointer every cadence run has written beside its checkpoints
    ("latest", {"save_latest_filename": "latest"}),  # cadence's older API: it names the pointer
])
def test_old_form_pointer_still_resumes(tmp_path: Path, pointer: str,
                                        trainer_kwargs: dict[str, Any]) -> None:
    """A save folder as an older cadence left it: the legacy checkpoint and the text pointer
    naming it. A newer checkpoint of the same run is there too (most recently written):
    autoresume follows the pointer, not the age, and continues exactly as loading the
    legacy checkpoint by path does."""
    decoy_losses, decoy = run(tmp_path / "decoy")  # its last checkpoint: batch 8 of 8
    decoy.close()
    copy = tmp_path / "legacy.pt"
    shutil.copyfile(FIXTURE, copy)
    loaded_losses, loaded = run(tmp_path / "loaded", load_path=str(copy))
    loaded.close()
    folder = tmp_path / "resumed"
    folder.mkdir()
    (newer,) = (tmp_path / "decoy").glob("ep*-ba8-rank0.pt")
    legacy = folder / "ep1-ba6-rank0.pt"
    shutil.copyfile(FIXTURE, legacy)
    os.utime(legacy, (1e9, 1e9))  # older than the decoy
    shutil.copyfile(newer, folder / newer.name)
    (folder / pointer).write_text(f"{legacy.name}\n")

    resumed_losses, resumed = run(folder, autoresume=True, **trainer_kwargs)
    resumed.close()

    assert sorted(resumed_losses) == [SAVED_AT + 1, SAVED_AT + 2]
    assert resumed_losses == loaded_losses
    a, b = loaded.state.model.state_dict(), resumed.state.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (folder / pointer).read_text().strip() == newer.name  # the resumed run's save
