"""The run behind ``fixtures/legacy-ep1-ba6.pt``: a checkpoint written by cadence before the
package moved to Composer's layout (main at 62650c9), kept so that every later layout still
loads and resumes it (``test_legacy_checkpoint.py``).

Regenerate only on purpose, and with the *older* cadence (the file must stay one that it
wrote): check out the fixture's commit (the one after 62650c9) in a worktree and run this
module from there, where it still sat under ``tests/trainer/checkpoint``::

    cd WORKTREE && PYTHONPATH=. python -m tests.trainer.checkpoint.legacy_run OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import torch
from torch.utils.data import DataLoader, Dataset

from cadence import Trainer, dist
from cadence.models.gpt import gpt2
from cadence.loggers import InMemoryLogger
from cadence.optim.scheduler import CosineAnnealingWithWarmupScheduler
from tests.common.events import StopAt

BATCHES_PER_EPOCH = 4
SAVED_AT = 6  # batches; the fixture's timestamp
TOTAL = "8ba"


class Counting(Dataset):
    """``{"input_ids", "labels"}: [10]`` int64 sequences; the next token is the last + 1."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(5)
        starts = torch.randint(0, 24, (BATCHES_PER_EPOCH * 2, 1), generator=gen)
        self.ids = (starts + torch.arange(10)) % 24

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def run(folder: Path, load_path: Optional[str] = None, stop_at: Optional[int] = None,
        fit: bool = True, **trainer_kwargs: Any) -> tuple[dict[int, float], Trainer]:
    """Train a 2-layer GPT-2 for ``TOTAL`` (dropout on, shuffled data, warmup + cosine LR,
    AdamW), or stop (and save) after batch ``stop_at``, or (``fit=False``) only build the
    Trainer (loading ``load_path``); ``trainer_kwargs``: more Trainer arguments
    (``autoresume``...).

    Returns:
        The logged training loss by batch, and the Trainer (after ``fit``).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one intra-op thread: the same sums on any machine, any suite order
    try:
        return _run(folder, load_path, stop_at, fit, **trainer_kwargs)
    finally:
        torch.set_num_threads(threads)


def _run(folder: Path, load_path: Optional[str], stop_at: Optional[int], fit: bool,
         **trainer_kwargs: Any) -> tuple[dict[int, float], Trainer]:
    torch.manual_seed(0)
    model = gpt2(n_layer=2, n_head=2, n_embd=16, vocab_size=24, max_seq_len=10, dropout=0.1)
    data = Counting()
    loader = DataLoader(data, batch_size=2, sampler=dist.get_sampler(data, shuffle=True, seed=3))
    memory = InMemoryLogger()
    trainer = Trainer(
        model=model, train_dataloader=loader, max_duration=TOTAL, seed=11,
        optimizers=torch.optim.AdamW(model.parameters(), lr=3e-3),
        schedulers=CosineAnnealingWithWarmupScheduler(t_warmup="2ba", alpha_f=0.1),
        loggers=[memory], log_interval="1ba", progress_bar=False, run_name="legacy",
        callbacks=[] if stop_at is None else [StopAt(stop_at)],
        save_folder=str(folder), save_interval="100ba", load_path=load_path, **trainer_kwargs,
    )
    if not fit:
        return {}, trainer
    trainer.fit()
    return dict(zip(*memory.steps_and_values("loss/train/total"))), trainer


if __name__ == "__main__":
    run(Path(sys.argv[1]), stop_at=SAVED_AT)
