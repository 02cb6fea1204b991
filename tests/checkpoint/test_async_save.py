"""Asynchronous checkpointing (``save_async=True``): checkpoints written in the background are
the same as synchronous ones and resume bit-exactly; a process SIGKILLed while a background
write is in flight resumes from the previous checkpoint; a failed background write fails the
run at the next event, naming the file."""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Callback, State, Trainer
from cadence.checkpoint.errors import CheckpointWriteError
from cadence.checkpoint.export import load_full_state
from cadence.checkpoint.manifest import HashingFile, verify_checkpoint
from tests.common.models import SimpleModel, make_dataloader
from tests.checkpoint.test_kill_resume import (
    LATEST, TOTAL, finish, latest, launch, loss_curve, run_file,
)

RUN = "async"


class Losses(Callback):
    """The loss of every batch, in order."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def batch_end(self, state: State, logger: Any) -> None:
        assert state.total_loss is not None
        self.losses.append(float(state.total_loss))


def trainer(folder: Path | None, fmt: str, save_async: bool, max_duration: str = "6ba",
            **kwargs: Any) -> tuple[Trainer, Losses]:
    torch.manual_seed(0)
    losses = Losses()
    return Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=4),
                   max_duration=max_duration, progress_bar=False,
                   run_name=RUN, seed=3, callbacks=[losses],
                   save_folder=None if folder is None else str(folder), save_interval="2ba",
                   save_state_dict_type=fmt, save_async=save_async, **kwargs), losses


def tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint at ``path``, by flattened key."""
    out: dict[str, torch.Tensor] = {}

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            out[prefix] = obj
        elif isinstance(obj, dict):
            for key, value in obj.items():
                walk(f"{prefix}/{key}", value)

    state = load_full_state(path)
    optimizers = {str(i): sd for i, sd in enumerate(state["optimizers"].values())}  # by position
    walk("", {"model": state["model"], "optimizers": optimizers})
    return out


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_async_checkpoints_equal_sync_ones_and_resume_bit_exactly(tmp_path: Path,
                                                                   fmt: str) -> None:
    sync, sync_losses = trainer(tmp_path / "sync", fmt, save_async=False)
    sync.fit()
    sync.close()
    run, run_losses = trainer(tmp_path / "async", fmt, save_async=True)
    run.fit()
    folder = tmp_path / "async"
    suffix = "-rank0.pt" if fmt == "full" else ""
    names = [f"ep{(b - 1) // 4}-ba{b}{suffix}" for b in (2, 4, 6)]
    # FIT_END waited for the last background save: on disk, and the pointer names it
    assert (folder / f"latest-{RUN}").read_text().strip() == names[-1]
    run.close()
    assert run_losses.losses == sync_losses.losses  # saving in the background changed nothing
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("ep")) == names
    for name in names:  # each a snapshot of its batch, not of later weights
        assert verify_checkpoint(folder / name)  # its CRC32Cs were written, and match
        got, want = tensors(folder / name), tensors(tmp_path / "sync" / name)
        assert got.keys() == want.keys() and len(got) > 4
        for key in want:
            assert torch.equal(got[key], want[key]), (name, key)
    # resume from the middle checkpoint: the same losses as the uninterrupted run, bit for bit
    resumed, resumed_losses = trainer(None, fmt, save_async=False,
                                      load_path=str(folder / names[0]))
    resumed.fit()
    resumed.close()
    assert resumed_losses.losses == sync_losses.losses[2:]


def test_sigkill_while_a_background_write_is_in_flight_resumes_bit_exactly(
        tmp_path: Path) -> None:
    """A real ``cadence train`` process with ``save_async: true``, SIGKILLed in the writer
    thread (batch 6's save: its data written, before the rename) and between batch 8's
    rename and its pointer; relaunched, it ends with the uninterrupted run's loss curve."""
    import yaml

    markers = tmp_path / "markers"
    reference = launch(run_file(tmp_path, "reference", None))  # uninterrupted, synchronous
    try:
        def async_run_file(kill: dict[str, Any]) -> Path:
            config = run_file(tmp_path, "killed", {"marker_dir": str(markers), **kill})
            config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()),
                                              "save_async": True}))
            return config

        # One kill point per launch: the loop runs ahead of the writer thread, so a launch that
        # armed both could pass batch 8 (using up its marker) before batch 6's write is killed.
        config = async_run_file({"during_save": [6]})
        folder = tmp_path / "killed"

        # 1. killed in the writer thread: batch 4's checkpoint (the save of batch 6 waited for
        # it) stays the latest; batch 6's temporary is never taken for a checkpoint
        code, out = finish(launch(config))
        assert code == -9, out[-3000:]
        assert latest(folder) == ("ep0-ba4-rank0.pt", 4)
        assert not (folder / "ep0-ba6-rank0.pt").exists()
        assert [p.name.split(".tmp-")[0] for p in folder.glob("*.tmp-*")] == ["ep0-ba6-rank0.pt"]

        # 2. killed after batch 8's rename, before its pointer moved
        config = async_run_file({"before_pointer": [8]})
        code, out = finish(launch(config))
        assert code == -9, out[-3000:]
        assert latest(folder) == ("ep0-ba6-rank0.pt", 6)

        # 3. the same command runs to the end
        code, out = finish(launch(config))
        assert code == 0, out[-3000:]
        assert latest(folder) == (f"ep1-ba{TOTAL}-rank0.pt", TOTAL)
        assert not list(folder.glob("*.tmp-*"))
        assert sorted(p.name for p in markers.iterdir()) == ["before_pointer-ba8",
                                                             "during_save-ba6"]
        code, out = finish(reference)
        assert code == 0, out[-3000:]
        expected, got = loss_curve(tmp_path / "reference"), loss_curve(folder)
        assert sorted(expected) == list(range(1, TOTAL + 1))
        assert got == expected  # bit-identical, every step
        assert (folder / LATEST).is_file()
    finally:  # a failed step leaks no running reference process (nor its pipe)
        if reference.returncode is None:  # not finished through finish()
            reference.kill()
            reference.communicate()


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_failed_background_write_fails_the_run_naming_the_file(tmp_path: Path, fmt: str,
                                                               monkeypatch: Any) -> None:
    """The disk fills up while batch 4's checkpoint is written in the background: the run
    fails (at the latest when batch 6's save waits for it), the error names the file and
    the intact checkpoint of batch 2, the temporary is gone, ``latest`` never moved."""
    real_write = HashingFile.write

    def write(self: HashingFile, data: Any) -> int:
        if (self.name.name.startswith("ep0-ba4") or self.name.parent.name.startswith("ep0-ba4")
                ) and threading.current_thread() is not threading.main_thread():
            self.error = OSError(errno.ENOSPC, "No space left on device", str(self.name))
            raise self.error
        return real_write(self, data)

    monkeypatch.setattr(HashingFile, "write", write)
    run, _ = trainer(tmp_path, fmt, save_async=True, max_duration="8ba")
    with pytest.raises(CheckpointWriteError) as caught:
        run.fit()
    run.close()
    message = str(caught.value)
    suffix = "-rank0.pt" if fmt == "full" else ""
    assert "no space left on device while writing" in message
    assert f"ep0-ba4{suffix}.tmp-" in message  # the file being written
    assert f"ep0-ba2{suffix} is intact" in message
    assert caught.value.errno == errno.ENOSPC
    assert int(run.state.timestamp.batch) < 8  # the run stopped, it did not train on
    assert (tmp_path / f"latest-{RUN}").read_text().strip() == f"ep0-ba2{suffix}"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ep")) == [
        f"ep0-ba2{suffix}"]  # no temporary left, no later checkpoint


def two_rank_run(folder: Path | None, fmt: str, save_async: bool,
                 load_path: str | None = None, model: Any = SimpleModel) -> Losses:
    """``model()`` (default SimpleModel) under FSDP2 on this process's rank, 8 batches (4 per
    epoch), a save every 2 batches."""
    from torch.utils.data import DataLoader, TensorDataset

    from cadence import dist

    gen = torch.Generator().manual_seed(5)
    data = TensorDataset(torch.randn(16, 8, generator=gen), torch.randint(0, 3, (16,),
                                                                          generator=gen))
    loader = DataLoader(data, batch_size=4 // dist.get_world_size(),
                        sampler=dist.get_sampler(data, shuffle=True, seed=3, drop_last=True))
    torch.manual_seed(0)
    losses = Losses()
    run = Trainer(model=model(), train_dataloader=loader, max_duration="8ba",
                  progress_bar=False, run_name=RUN, seed=3, callbacks=[losses],
                  save_folder=None if folder is None else str(folder), save_interval="2ba",
                  save_state_dict_type=fmt, save_async=save_async, load_path=load_path,
                  parallelism_config={"fsdp": {"state_dict_type": fmt}})
    run.fit()
    if folder is not None and save_async:  # FIT_END waited on every rank
        suffix = "-rank0.pt" if fmt == "full" else ""
        assert (folder / f"latest-{RUN}").read_text().strip() == f"ep1-ba8{suffix}"
    run.close()
    return losses


@pytest.mark.world_size(2)
@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_async_saves_on_two_fsdp_ranks_resume_bit_exactly(tmp_path: Path, fmt: str) -> None:
    from cadence import dist

    sync = two_rank_run(tmp_path / "sync", fmt, save_async=False)
    run = two_rank_run(tmp_path / "async", fmt, save_async=True)
    assert run.losses == sync.losses
    suffix = "-rank0.pt" if fmt == "full" else ""
    if dist.get_global_rank() == 0:
        for batch in (2, 4, 6, 8):
            name = f"ep{(batch - 1) // 4}-ba{batch}{suffix}"
            assert verify_checkpoint(tmp_path / "async" / name)
            got, want = tensors(tmp_path / "async" / name), tensors(tmp_path / "sync" / name)
            assert got.keys() == want.keys()
            for key in want:
                assert torch.equal(got[key], want[key]), (name, key)
    dist.barrier()
    resumed = two_rank_run(None, fmt, save_async=False,
                           load_path=str(tmp_path / "async" / f"ep0-ba2{suffix}"))
    assert resumed.losses == sync.losses[2:]
