"""Data across ranks: every data-parallel rank must see distinct samples (and the ranks of
one tensor-parallel group the same ones), and metrics must count each sample once: not the
samples a ``DistributedSampler`` repeats to even out the ranks, nor a tensor-parallel
group's shared samples once per rank of the group."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, Optional

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from cadence.utils import dist

if TYPE_CHECKING:
    import torch.distributed as torch_dist
    from torchmetrics import Metric

__all__ = ["check_distributed_sampler", "align_sampler_with_data_parallel",
           "real_samples_on_rank", "sync_metrics_over"]


def check_distributed_sampler(dataloader: Any, name: str, dp_size: Optional[int] = None
                              ) -> None:
    """With several data-parallel ranks, refuse a map-style dataset without a
    ``DistributedSampler`` (every data-parallel rank would train on the same samples).

    A run of one data-parallel group (tensor parallelism only: every rank is one TP group,
    whose ranks must see the same samples) takes a plain ``DataLoader``.

    Args:
        dataloader: the dataloader to check (anything else passes).
        name: its name in the message.
        dp_size: the data-parallel ranks (world size / ``tensor_parallel_degree``); None:
            the world size.

    Raises:
        ValueError: naming the dataloader and pointing to ``cadence.dist.get_sampler``.
    """
    dp_size = dist.get_world_size() if dp_size is None else dp_size
    if dp_size <= 1 or not isinstance(dataloader, DataLoader):
        return
    if isinstance(dataloader.dataset, IterableDataset):
        return  # an iterable dataset shards itself
    sampler = dataloader.batch_sampler.sampler if dataloader.batch_sampler is not None else None
    if not isinstance(sampler, DistributedSampler):
        raise ValueError(
            f"{name} uses {type(sampler).__name__} in a run of {dp_size} data-parallel ranks "
            f"(of {dist.get_world_size()}), so every data-parallel rank would see the same "
            f"samples. Build it with DataLoader(dataset, batch_size=..., "
            f"sampler=cadence.dist.get_sampler(dataset, shuffle=...)) instead."
        )


def align_sampler_with_data_parallel(dataloader: Any, name: str, dp_size: int,
                                     dp_rank: int) -> None:
    """Make ``dataloader``'s ``DistributedSampler`` split the data over the data-parallel
    ranks only, so the ranks of one tensor-parallel group load the same samples.

    A sampler built for the whole world (``cadence.dist.get_sampler`` defaults:
    ``num_replicas = world size``, ``rank = global rank``) is re-pointed in place to
    ``num_replicas = dp_size``, ``rank = dp_rank``; one already built that way is left
    alone. Nothing happens when ``dp_size`` is the world size (no tensor parallelism).

    Raises:
        ValueError: the sampler was built for another split, naming the dataloader and the
            split it needs.
    """
    world = dist.get_world_size()
    if dp_size == world or not isinstance(dataloader, DataLoader) \
            or dataloader.batch_sampler is None:
        return
    sampler = dataloader.batch_sampler.sampler
    if not isinstance(sampler, DistributedSampler):
        return
    if (sampler.num_replicas, sampler.rank) == (dp_size, dp_rank):
        return
    if (sampler.num_replicas, sampler.rank) != (world, dist.get_global_rank()):
        raise ValueError(
            f"{name}'s DistributedSampler has num_replicas={sampler.num_replicas}, "
            f"rank={sampler.rank}; with tensor parallelism it must split over the "
            f"{dp_size} data-parallel ranks: num_replicas={dp_size}, rank={dp_rank} (or leave "
            f"both to cadence.dist.get_sampler's defaults).")
    sampler.num_replicas, sampler.rank = dp_size, dp_rank
    total = len(sampler.dataset)  # the same arithmetic as DistributedSampler.__init__
    if sampler.drop_last and total % dp_size != 0:
        sampler.num_samples = math.ceil((total - dp_size) / dp_size)
    else:
        sampler.num_samples = math.ceil(total / dp_size)
    sampler.total_size = sampler.num_samples * dp_size


def real_samples_on_rank(dataloader: Any) -> Optional[int]:
    """How many of this rank's samples are real, when its ``DistributedSampler`` pads the
    dataset to a multiple of the world size (``drop_last=False``); None when nothing is padded.

    The sampler's padded copies sit at global positions ``>= len(dataset)``; this rank's
    ``k``-th sample is at position ``rank + k * world_size``, so its first
    ``ceil((len(dataset) - rank) / world_size)`` samples are real and the rest are copies.
    """
    if not isinstance(dataloader, DataLoader) or dataloader.batch_sampler is None:
        return None
    sampler = dataloader.batch_sampler.sampler
    if not isinstance(sampler, DistributedSampler) or sampler.drop_last:
        return None
    total, replicas, rank = len(sampler.dataset), sampler.num_replicas, sampler.rank
    if total % replicas == 0:
        return None
    return max(0, math.ceil((total - rank) / replicas))


def sync_metrics_over(metrics: Iterable[Metric], group: Optional[torch_dist.ProcessGroup]
                      ) -> None:
    """Make ``metrics`` (and the metrics inside them: wrappers, collections) sync their
    state over ``group`` when computed: the data-parallel ranks under tensor parallelism
    (:meth:`~cadence.parallel.parallel_dims.ParallelDims.data_parallel_group`), so the
    ranks of one tensor-parallel group, which see the same samples, count them once (sums
    such as sample counts, not just averages). ``group`` None (no tensor parallelism): the metrics are
    left as they are (torchmetrics syncs over the world unless given a group).

    Source: torchmetrics ``Metric(process_group=...)``.
    """
    if group is None:
        return
    from torchmetrics import Metric  # only with tensor parallelism: keeps the import light

    for metric in metrics:
        for module in metric.modules():
            if isinstance(module, Metric):
                module.process_group = group
