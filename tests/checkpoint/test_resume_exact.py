"""Exact resume: a run stopped after batch k and resumed gives bit-identical losses to the
uninterrupted run (same world size), at an epoch boundary and mid-epoch; elastic N -> M."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from cadence import Callback, Trainer, dist
from cadence.models.gpt import gpt2
from cadence.loggers import InMemoryLogger
from cadence.optim.scheduler import CosineAnnealingWithWarmupScheduler
from tests.common.events import StopAt

BATCHES_PER_EPOCH = 5
TOTAL = "15ba"  # 3 epochs
GLOBAL_BATCH = 4


class Counting(Dataset):
    """Learnable sequences ``{"input_ids", "labels"}: [12]`` (next token = last + 1)."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(7)
        starts = torch.randint(0, 32, (BATCHES_PER_EPOCH * GLOBAL_BATCH, 1), generator=gen)
        self.ids = (starts + torch.arange(12)) % 32

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def run(folder: Path, stop_at: Optional[int] = None, autoresume: bool = False,
        fsdp: bool = False, state_dict_type: str = "full", load_path: Optional[str] = None,
        max_duration: str = TOTAL) -> tuple[dict[int, float], Trainer]:
    """Train (dropout on, shuffled data, warmup + cosine LR); the logged loss by step."""
    torch.manual_seed(0)
    model = gpt2(n_layer=2, n_head=2, n_embd=32, vocab_size=32, max_seq_len=12, dropout=0.1)
    data = Counting()
    loader = DataLoader(data, batch_size=GLOBAL_BATCH // dist.get_world_size(),
                        sampler=dist.get_sampler(data, shuffle=True, seed=3, drop_last=True))
    memory = InMemoryLogger()
    callbacks: list[Callback] = [] if stop_at is None else [StopAt(stop_at)]
    trainer = Trainer(
        model=model, train_dataloader=loader, max_duration=max_duration, seed=11,
        optimizers=torch.optim.AdamW(model.parameters(), lr=3e-3),
        schedulers=CosineAnnealingWithWarmupScheduler(t_warmup="3ba", alpha_f=0.1),
        device_train_microbatch_size=1, loggers=[memory], callbacks=callbacks,
        log_interval="1ba", progress_bar=False, run_name="exact", save_folder=str(folder),
        save_interval="1ba" if stop_at is None else "100ba", save_num_checkpoints_to_keep=2,
        save_state_dict_type=state_dict_type, autoresume=autoresume, load_path=load_path,
        parallelism_config={"fsdp": {"state_dict_type": state_dict_type}} if fsdp else None,
    )
    trainer.fit()
    trainer.close()
    return dict(zip(*memory.steps_and_values("loss/train/total"))), trainer


def check_resume(tmp_path: Path, stop_at: int, fsdp: bool, fmt: str) -> None:
    full_run, _ = run(tmp_path / "a", fsdp=fsdp, state_dict_type=fmt)
    first, _ = run(tmp_path / "b", stop_at=stop_at, fsdp=fsdp, state_dict_type=fmt)
    assert max(first) == stop_at
    resumed, trainer = run(tmp_path / "b", autoresume=True, fsdp=fsdp, state_dict_type=fmt)
    assert min(resumed) == stop_at + 1 and max(resumed) == 15
    for step in range(1, 16):
        got = first[step] if step <= stop_at else resumed[step]
        assert got == full_run[step], f"step {step}: {got!r} != {full_run[step]!r} (bit-exact)"
    assert trainer.state.timestamp.batch == 15 and trainer.state.timestamp.epoch == 3


@pytest.mark.parametrize("stop_at", [5, 7], ids=["epoch_boundary", "mid_epoch"])
@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_exact_resume_single_process(tmp_path: Path, stop_at: int, fmt: str) -> None:
    check_resume(tmp_path, stop_at, fsdp=False, fmt=fmt)


@pytest.mark.world_size(2)
@pytest.mark.parametrize("stop_at", [5, 7], ids=["epoch_boundary", "mid_epoch"])
def test_exact_resume_fsdp_sharded_two_ranks(tmp_path: Path, stop_at: int) -> None:
    check_resume(tmp_path, stop_at, fsdp=True, fmt="sharded")


def _save_on_two_ranks(folder: str) -> None:
    run(Path(folder), stop_at=6, fsdp=True, state_dict_type="sharded")


def _resume_on_two_ranks(checkpoint: str, folder: str) -> None:
    losses, trainer = run(Path(folder), fsdp=True, state_dict_type="sharded",
                          load_path=checkpoint)
    assert trainer.state.timestamp.batch == 15 and min(losses) == 7
    assert all(torch.isfinite(torch.tensor(list(losses.values()))))


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(trainer.state.model,
                                options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def test_elastic_two_ranks_to_one(tmp_path: Path) -> None:
    from tests.common.distributed import run_in_processes

    run_in_processes(2, __file__, "_save_on_two_ranks", {"folder": str(tmp_path / "two")})
    checkpoint = tmp_path / "two" / "ep1-ba6"
    assert (checkpoint / ".metadata").is_file()
    # one process, no FSDP: the sharded checkpoint is resharded into plain tensors
    losses, trainer = run(tmp_path / "one", load_path=str(checkpoint))
    assert min(losses) == 7 and trainer.state.timestamp.batch == 15
    reference = torch.load(checkpoint / "extra.pt", weights_only=True)
    assert reference["timestamp"]["batch"] == 6


def test_elastic_one_rank_to_two(tmp_path: Path) -> None:
    from tests.common.distributed import run_in_processes

    run(tmp_path / "one", stop_at=6, state_dict_type="sharded")
    checkpoint = tmp_path / "one" / "ep1-ba6"
    assert (checkpoint / ".metadata").is_file()
    run_in_processes(2, __file__, "_resume_on_two_ranks",
                     {"checkpoint": str(checkpoint), "folder": str(tmp_path / "two")})
