"""Issue 25, item 6: non-finite weights never become the newest checkpoint. With lr 1e30
the losses turn NaN; the save that finds NaN/inf in its batch's loss or in the weights writes
the state aside (``*.nonfinite``), leaves ``latest`` on the last finite checkpoint and stops
the run naming the first non-finite batch; ``save_allow_nonfinite=True`` opts out. The
check's cost (one max-abs reduction per tensor) is measured against the save itself."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Trainer
from cadence.checkpoint.files import NONFINITE_SUFFIX
from cadence.checkpoint.store import find_latest_checkpoint
from cadence.checkpoint.finite import NonFiniteStateError, nonfinite_state
from cadence.config.load import load_config
from tests.common.models import SimpleModel, make_dataloader

RUN = "nan"
LATEST = f"latest-{RUN}"


def _trainer(folder: Path, lr: float, **kwargs: Any) -> Trainer:
    torch.manual_seed(0)
    model = SimpleModel()
    loader = DataLoader(make_dataloader(num_batches=8, batch_size=4).dataset, batch_size=4)
    return Trainer(model=model, train_dataloader=loader, max_duration="8ba",
                   optimizers=torch.optim.SGD(model.parameters(), lr=lr), progress_bar=False,
                   run_name=RUN, seed=1, save_folder=str(folder),
                   **{"save_interval": "1ba", **kwargs})


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_lr_1e30_stops_at_the_first_nonfinite_save(tmp_path: Path, fmt: str) -> None:
    folder = tmp_path / "run"
    trainer = _trainer(folder, 1e30, save_state_dict_type=fmt, autoresume=True)
    with pytest.raises(NonFiniteStateError) as info:
        trainer.fit()
    trainer.close()
    message = str(info.value)
    batch = int(trainer.state.timestamp.batch)
    suffix = "-rank0.pt" if fmt == "full" else ""
    aside = folder / f"ep0-ba{batch}{suffix}{NONFINITE_SUFFIX}"
    assert f"Not saving a checkpoint at batch {batch}" in message
    assert "The first non-finite loss was at batch" in message or "Every loss" in message
    assert str(aside) in message and aside.exists()  # written aside, for debugging
    assert "save_allow_nonfinite: true" in message
    last = f"ep0-ba{batch - 1}{suffix}"
    assert (folder / LATEST).read_text().strip() == last  # the pointer did not move
    assert f"the latest pointer still names {folder / last}" in message
    assert not (folder / f"ep0-ba{batch}{suffix}").exists()
    # what the pointer names is finite, and autoresume takes it (never the aside)
    assert find_latest_checkpoint(folder, LATEST) == folder / last
    resumed = _trainer(folder, 1e30, save_state_dict_type=fmt, autoresume=True)
    assert resumed.hyperparameters["loaded_checkpoint"] == str(folder / last)
    assert nonfinite_state(resumed.state.model, None) is None
    resumed.close()


def test_first_nonfinite_batch_is_named(tmp_path: Path) -> None:
    """Saving every 4 batches: the error names the first batch whose loss was NaN/inf,
    tracked without a host sync per batch."""
    trainer = _trainer(tmp_path / "run", 1e30, save_interval="4ba")
    with pytest.raises(NonFiniteStateError) as info:
        trainer.fit()
    trainer.close()
    first = int(str(info.value).split("The first non-finite loss was at batch ")[1].split(".")[0])
    assert 1 <= first <= 4 and "at batch 4 " in str(info.value)


def test_opt_out_saves_nonfinite_states(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    trainer = _trainer(folder, 1e30, save_allow_nonfinite=True)
    trainer.fit()
    trainer.close()
    assert (folder / LATEST).read_text().strip() == "ep0-ba8-rank0.pt"
    assert nonfinite_state(trainer.state.model, None) is not None
    assert not list(folder.glob(f"*{NONFINITE_SUFFIX}"))


def test_run_file_keys(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("max_duration: 1ba\nglobal_train_batch_size: 4\nmodel: {name: gpt2}\n"
                      "train_loader: {name: shakespeare}\n")
    cfg = load_config(str(config), ["save_allow_nonfinite=true", "require_checksums=false"])
    assert cfg.save_allow_nonfinite is True and cfg.require_checksums is False


def test_cost_of_the_check_is_one_reduction_per_tensor(tmp_path: Path) -> None:
    """The check on a stack of 24 Linear(1024, 1024) layers (25M parameters, fp32, CPU) costs
    about what summing every tensor once costs (the floor for reading each value once), and is
    printed beside a ``torch.save`` of the same state for the record."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(24)])
    tensors = [p.detach() for p in model.parameters()]
    loss = torch.tensor(1.0)

    def timed(fn: Any, repeat: int = 3) -> float:
        fn()  # warm up
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        return (time.perf_counter() - start) / repeat

    check = timed(lambda: nonfinite_state(model, loss))
    floor = timed(lambda: torch.stack([t.sum() for t in tensors]).tolist())
    save = timed(lambda: torch.save(model.state_dict(), tmp_path / "m.pt"), repeat=1)
    print(f"finite check: {check * 1e3:.1f} ms for {sum(t.numel() for t in tensors)} "
          f"parameters in {len(tensors)} tensors; one sum per tensor: {floor * 1e3:.1f} ms; "
          f"torch.save of the same state: {save * 1e3:.1f} ms")
    assert nonfinite_state(model, loss) is None
    assert check < 3 * floor + 0.05  # one reduction per tensor, not several passes
    model[5].weight.data.fill_(3e37)  # finite, but its sum overflows: not taken for NaN
    assert nonfinite_state(model, loss) is None
    model[3].weight.data[0, 0] = float("nan")
    assert "1 of 48 parameters and buffers hold NaN or inf (3.weight)" in str(
        nonfinite_state(model, loss))
