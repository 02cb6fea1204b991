"""Resuming: which checkpoint to load, and the rest of an epoch without replaying it.

The data position is the timestamp's ``batch_in_epoch``. For a ``DataLoader`` with a
sampler, resuming builds the same loader over the sampler's index list minus the consumed
prefix (:class:`SkipSampler`), so no consumed sample is loaded again and resume time does
not grow with the position in the epoch. Other iterables are advanced batch by batch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler

from cadence.utils import dist
from cadence.checkpoint.errors import CheckpointError
from cadence.checkpoint.files import (
    checkpoint_candidates, remove_checkpoint, remove_stale_temporaries,
)
from cadence.checkpoint.remote import (
    COMPLETE_SUFFIX, RemoteFolder, is_remote, local_path,
)

__all__ = ["SkipSampler", "newest_intact_checkpoint", "newest_intact_remote_checkpoint",
           "resolve_load_path",
           "skip_consumed_batches", "written_by"]

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

    The fallback of :func:`~cadence.checkpoint.data_position.iter_epoch` when the
    checkpoint has no data position for this rank (an older checkpoint, another world
    size): exact for a seeded sampler (``cadence.dist.get_sampler``), not for a
    ``RandomSampler``, whose order is then drawn anew (warned).
    """
    rng = torch.get_rng_state()
    if (isinstance(dataloader, DataLoader) and isinstance(dataloader.batch_sampler, BatchSampler)
            and type(dataloader.batch_sampler) is BatchSampler):
        if isinstance(dataloader.batch_sampler.sampler, RandomSampler):
            log.warning("Resuming mid-epoch without the checkpoint's data position (an older "
                        "checkpoint, or another world size): the RandomSampler draws a new "
                        "order for the rest of this epoch, so some of its samples may be seen "
                        "twice and others not at all.")
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
    from cadence.checkpoint.checkpoint import read_metadata

    try:
        return read_metadata(path).get("run_name") == run_name
    except CheckpointError:
        return False


def newest_intact_checkpoint(folder: Path, latest_filename: str,
                             run_name: Optional[str]) -> Optional[Path]:
    """The newest checkpoint of ``run_name`` in ``folder`` that passes its checksums: the one
    the ``latest`` pointer names, else (or when it fails) the newest complete one whose
    metadata names the run. Each rejected checkpoint is logged as a warning naming it and
    the file that failed. Rank-local.

    Raises:
        CheckpointError: the pointer is garbage or points outside ``folder``; or the run has
            checkpoints there and none passes (the message lists why each failed).
    """
    from cadence.checkpoint.checkpoint import verify

    rejected: list[str] = []
    for candidate in checkpoint_candidates(folder, latest_filename,
                                           belongs=lambda p: written_by(p, run_name)):
        try:
            verify(candidate)
        except CheckpointError as exc:
            log.warning("Autoresume rejects checkpoint %s: %s", candidate, exc)
            rejected.append(f"{candidate}: {exc}")
            continue
        if rejected:
            log.warning("Autoresume falls back to %s, the newest checkpoint of run %s that "
                        "passes its checksums (rejected: %s).", candidate, run_name,
                        ", ".join(r.split(": ", 1)[0] for r in rejected))
        return candidate
    if rejected:
        raise CheckpointError(
            f"Autoresume found checkpoints of run {run_name} in {folder}, but none passes its "
            f"checksums: {'; '.join(rejected)}. Move them away to start afresh, or pass a "
            f"checkpoint you trust as load_path.")
    return None


def newest_intact_remote_checkpoint(url: str, latest_filename: str,
                                    run_name: Optional[str]) -> Optional[str]:
    """:func:`newest_intact_checkpoint` for a remote folder: the newest checkpoint of
    ``run_name`` with a completion marker that downloads and passes its checksums (the
    copy stays in the stage for the load). Rank-local.

    Raises:
        CheckpointError: as :func:`newest_intact_checkpoint`.
    """
    from cadence.checkpoint.checkpoint import verify

    remote = RemoteFolder(url)
    rejected: list[str] = []
    for name in remote.candidates(latest_filename, run_name):
        try:
            verify(remote.download(name))
        except (CheckpointError, OSError) as exc:
            remove_checkpoint(remote.stage / "loaded" / name)  # the rejected copy
            log.warning("Autoresume rejects checkpoint %s: %s", remote.url_of(name), exc)
            rejected.append(f"{remote.url_of(name)}: {exc}")
            continue
        if rejected:
            log.warning("Autoresume falls back to %s, the newest checkpoint of run %s that "
                        "passes its checksums.", remote.url_of(name), run_name)
        return remote.url_of(name)
    if rejected:
        raise CheckpointError(
            f"Autoresume found checkpoints of run {run_name} in {url}, but none passes its "
            f"checksums: {'; '.join(rejected)}. Delete them (or their {COMPLETE_SUFFIX} "
            f"markers) to start afresh, or pass a checkpoint you trust as load_path.")
    return None


def resolve_load_path(autoresume: bool, save_folder: Optional[str], latest_filename: str,
                      load_path: Optional[str], run_name: Optional[str] = None
                      ) -> tuple[Optional[Union[Path, str]], bool]:
    """The checkpoint to load (a local path, or the URL of a remote one: load it through
    :func:`~cadence.checkpoint.remote.fetched`) and whether it is an autoresume (a
    full restore).

    With ``autoresume``, the newest intact checkpoint of ``run_name`` in ``save_folder``
    (:func:`newest_intact_checkpoint`) wins; without one (a fresh run) ``load_path`` is used.
    Before that, the run's own stale temporaries in ``save_folder`` (left by a killed save)
    are removed (:func:`~cadence.checkpoint.files.remove_stale_temporaries`). Rank 0
    decides; every rank gets its answer.

    Raises:
        CheckpointError: on every rank, as :func:`newest_intact_checkpoint` raises it.
    """
    choice: list[Any] = [None, False, None]  # path, resuming, error
    if dist.get_global_rank() == 0:
        try:
            remote = is_remote(save_folder)
            stage = None if save_folder is None else (
                RemoteFolder(save_folder).stage if remote else local_path(save_folder))
            if stage is not None and run_name is not None:
                removed = remove_stale_temporaries(stage, run_name, latest_filename)
                if removed:
                    log.info("Removed %d stale temporaries of run %s (unfinished saves): %s",
                             len(removed), run_name, ", ".join(p.name for p in removed))
            if autoresume and save_folder is not None:
                found = (newest_intact_remote_checkpoint(save_folder, latest_filename, run_name)
                         if remote else newest_intact_checkpoint(stage, latest_filename,
                                                                 run_name))
                if found is not None:
                    choice = [str(found), True, None]
        except (CheckpointError, ValueError, OSError) as exc:  # also: the store unreachable
            choice[2] = str(exc)
        if choice[0] is None and choice[2] is None and load_path is not None:
            choice = [load_path, False, None]
    dist.broadcast_object_list(choice)
    if choice[2] is not None:
        raise CheckpointError(choice[2])
    path = choice[0]
    if path is not None and not is_remote(path):
        path = local_path(path)
    return path, bool(choice[1])
