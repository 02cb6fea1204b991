"""Resuming: which checkpoint to load, and the rest of an epoch without replaying it.

The data position is the timestamp's ``batch_in_epoch``. For a ``DataLoader`` with a
sampler, resuming builds the same loader over the sampler's index list minus the consumed
prefix (:class:`SkipSampler`), so no consumed sample is loaded again and resume time does
not grow with the position in the epoch. Other iterables are advanced batch by batch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from torch.utils.data import BatchSampler, DataLoader, Sampler

from cadence.trainer import dist
from cadence.trainer.checkpoint.files import find_latest_checkpoint

__all__ = ["SkipSampler", "resolve_load_path", "skip_consumed_batches", "written_by"]

log = logging.getLogger(__name__)


class SkipSampler(Sampler[int]):
    """``sampler``'s indices without the first ``skip`` (the permutation is still the epoch's:
    ``set_epoch`` is called on ``sampler`` before iterating)."""

    def __init__(self, sampler: Sampler[int], skip: int) -> None:
        self.sampler, self.skip = sampler, skip

    def __iter__(self) -> Iterator[int]:
        indices = list(iter(self.sampler))  # indices only: no sample is loaded here
        return iter(indices[self.skip:])

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.skip)  # type: ignore[arg-type]


def skip_consumed_batches(dataloader: Any, batches: int) -> tuple[Iterator[Any], Optional[int]]:
    """An iterator over ``dataloader``'s current epoch after its first ``batches`` batches,
    and how many batches it will yield (None if unknown).

    The torch RNG is left as it was: creating a DataLoader iterator draws a seed from it,
    which the uninterrupted run did at the start of the epoch, before the checkpoint.
    """
    rng = torch.get_rng_state()
    if (isinstance(dataloader, DataLoader) and isinstance(dataloader.batch_sampler, BatchSampler)
            and type(dataloader.batch_sampler) is BatchSampler):
        batch_size = dataloader.batch_sampler.batch_size
        sampler = SkipSampler(dataloader.batch_sampler.sampler, batches * batch_size)
        resumed = DataLoader(
            dataloader.dataset, batch_size=batch_size, sampler=sampler,
            num_workers=dataloader.num_workers, collate_fn=dataloader.collate_fn,
            pin_memory=dataloader.pin_memory, drop_last=dataloader.drop_last,
            timeout=dataloader.timeout, worker_init_fn=dataloader.worker_init_fn,
            generator=dataloader.generator, persistent_workers=False,
        )
        iterator, length = iter(resumed), len(resumed)
    else:
        log.warning("Resuming mid-epoch by replaying %d batches of a %s (it has no sampler to "
                    "skip with).", batches, type(dataloader).__name__)
        iterator = iter(dataloader)
        for _ in range(batches):
            next(iterator)
        try:
            length = len(dataloader) - batches
        except TypeError:
            length = None
    torch.set_rng_state(rng)
    return iterator, length


def written_by(path: Path, run_name: Optional[str]) -> bool:
    """Whether the checkpoint at ``path`` was written by run ``run_name`` (its metadata)."""
    from cadence.trainer.checkpoint.checkpoint import CheckpointError, read_metadata

    try:
        return read_metadata(path).get("run_name") == run_name
    except CheckpointError:
        return False


def resolve_load_path(autoresume: bool, save_folder: Optional[str], latest_filename: str,
                      load_path: Optional[str],
                      run_name: Optional[str] = None) -> tuple[Optional[Path], bool]:
    """The checkpoint to load and whether it is an autoresume (a full restore).

    With ``autoresume``, the newest complete checkpoint of ``run_name`` in ``save_folder``
    (the one its ``latest`` pointer names, else the newest whose metadata names the run) wins;
    without one
    (a fresh run) ``load_path`` is used. Rank 0 decides; every rank gets its answer.
    """
    choice: list[Any] = [None, False]
    if dist.get_global_rank() == 0:
        if autoresume and save_folder is not None:
            found = find_latest_checkpoint(Path(save_folder), latest_filename,
                                           belongs=lambda p: written_by(p, run_name))
            if found is not None:
                choice = [str(found), True]
        if choice[0] is None and load_path is not None:
            choice = [load_path, False]
    dist.broadcast_object_list(choice)
    return (Path(choice[0]) if choice[0] is not None else None), bool(choice[1])
