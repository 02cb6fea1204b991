"""Where the train dataloader is within its epoch, kept in the checkpoint so that a resumed
run loads exactly the batches the uninterrupted run would have loaded.

The timestamp says how many batches of the epoch were consumed (``batch_in_epoch``); this
module says *which* batches they were. A ``DataLoader``'s epoch is decided by random draws
made when its iterator is created: the workers' ``base_seed`` (from the loader's
``generator``, else the global torch RNG) and the sampler's permutation (a ``RandomSampler``
without a generator draws its seed from the global torch RNG; with one it draws from it).
So at the start of every epoch the Trainer records the state of those RNGs
(:func:`iter_epoch`); a checkpoint keeps that record per rank (:func:`save_data_position`),
and a resume mid-epoch (:func:`load_data_position`, then :func:`iter_epoch`) sets the RNGs
back to it, recreates the epoch's index order and worker seed, skips the consumed batches
without loading them, and puts the RNGs back to the checkpoint's state, so every later draw
(dropout, the next epoch's permutation) is the uninterrupted run's.

What each kind of train dataloader gets on a resume mid-epoch:

- ``torch.utils.data.DataLoader`` over a map-style dataset (any sampler: ``shuffle=True``,
  a user ``generator``, ``cadence.dist.get_sampler``, a custom batch sampler; any
  ``num_workers``): the exact order, nothing loaded twice or skipped. The workers get the
  uninterrupted run's ``base_seed``; randomness drawn *inside* worker processes (a random
  augmentation in ``__getitem__`` with ``num_workers > 0``) restarts from that seed at the
  resume point, because a worker's RNG position depends on every sample it loaded before.
- ``torchdata.stateful_dataloader.StatefulDataLoader``: its ``state_dict()`` is the record
  and ``load_state_dict`` restores it, so iterable datasets that implement
  ``state_dict``/``load_state_dict`` resume exactly without replay.
- Any other loader with ``state_dict()`` and ``load_state_dict(state)`` (duck-typed, as
  Composer: mosaicml-streaming's ``StreamingDataLoader``): ``state_dict()`` at the checkpoint
  is the record; on resume ``load_state_dict`` is called with it before the epoch's
  ``iter()``, and the loader continues where it was (streaming: its dataset skips the
  samples already seen, no replay). Its state is the loader's own: a checkpoint from another
  number of ranks restores rank 0's (streaming's state is global, a sample count, so the
  sample order continues on the new ranks with the same global batch size). Such a loader
  should be sized (streaming's is): a checkpoint at an epoch's last batch then ends that
  epoch without asking the loader, whose restored state starts the next one.
- A ``DataLoader`` over a dataset with ``state_dict(num_samples, from_beginning)`` and
  ``load_state_dict`` (Composer's rule, for streaming's ``StreamingDataset``, which
  llm-foundry loads with a plain ``DataLoader``): mid-epoch, the checkpoint holds
  ``dataset.state_dict(sample_in_epoch, True)`` (the timestamp's global samples) and the
  resume hands it to ``load_state_dict`` before ``iter()``: the dataset continues its epoch
  (its own epoch count and shuffle) without loading the consumed samples. At an epoch
  boundary nothing is restored (streaming's state there names the epoch just finished).
  From another number of ranks rank 0's entry is restored on every rank: the count is
  global, so with the same global batch the sample order continues (measured with
  streaming 0.12 under llm-foundry, 2 ranks -> 1 and 1 -> 2: README).
- A ``DataLoader`` over an ``IterableDataset``: replayed (the consumed batches are loaded
  again and dropped) from the recorded RNG state, with a warning.
- Any other iterable: replayed from a fresh ``iter()`` with a warning
  (:func:`skip_consumed_batches`, also the fallback when the checkpoint has no usable record:
  a ``DataLoader`` over a map-style dataset with a plain ``BatchSampler`` then skips the
  consumed prefix of its sampler's indices without loading it; one over an
  ``IterableDataset`` is replayed).

Both ways of skipping without loading rebuild the loader over the remaining indices
(:class:`RemainingIndices`, :func:`rebuild_dataloader`), keeping every constructor argument.

Assumptions: a sampler draws its randomness when its iteration starts (every torch sampler
does), and nothing else draws from the global RNG between the epoch's ``iter()`` and its
first batch. Checkpoint key: ``data`` (one entry per rank; ``load_ignore_keys=["data"]``
skips it). Source: ``torch.utils.data.dataloader._BaseDataLoaderIter`` (where ``base_seed``
is drawn), ``torchdata.stateful_dataloader``.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from typing import Any, Iterable, Iterator, Optional, Sized

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler

from cadence.utils import dist

__all__ = ["RemainingIndices", "has_dataset_state", "has_loader_state", "iter_epoch",
           "load_data_position", "rebuild_dataloader", "save_data_position",
           "skip_consumed_batches"]

log = logging.getLogger(__name__)


class _Tracker:
    """What this process knows about one train dataloader's current epoch."""

    def __init__(self) -> None:
        self.origin: Optional[dict[str, Any]] = None  # RNG states the epoch was created from
        self.seed_source: Optional[torch.Tensor] = None  # the state base_seed was drawn from
        self.iterator: Any = None  # the last iterator iter() returned (persistent reuse)
        self.restored: Optional[dict[str, Any]] = None  # from a checkpoint, for the next epoch


_TRACKERS: weakref.WeakKeyDictionary[Any, _Tracker] = weakref.WeakKeyDictionary()


def _tracker(dataloader: Any) -> Optional[_Tracker]:
    try:
        return _TRACKERS.setdefault(dataloader, _Tracker())
    except TypeError:  # not weak-referenceable (a list, a generator): nothing to record
        return None


def _is_stateful_loader(dataloader: Any) -> bool:
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:  # pragma: no cover - torchdata is a dependency
        return False
    return isinstance(dataloader, StatefulDataLoader)


def has_loader_state(dataloader: Any) -> bool:
    """Whether ``dataloader`` keeps its own position (other than torchdata's
    ``StatefulDataLoader``): callable ``state_dict()`` and ``load_state_dict(state)``, as
    Composer checks (``hasattr``) for mosaicml-streaming's ``StreamingDataLoader``."""
    return (dataloader is not None and not _is_stateful_loader(dataloader)
            and callable(getattr(dataloader, "state_dict", None))
            and callable(getattr(dataloader, "load_state_dict", None)))


def has_dataset_state(dataloader: Any) -> bool:
    """Whether ``dataloader`` is a ``DataLoader`` over a dataset that keeps its own position,
    as Composer reads it: ``dataset.state_dict(num_samples, from_beginning)`` and
    ``dataset.load_state_dict(state)`` (mosaicml-streaming's ``StreamingDataset``, which
    llm-foundry loads with a plain ``DataLoader``)."""
    dataset = getattr(dataloader, "dataset", None)
    if not isinstance(dataloader, DataLoader) or not callable(
            getattr(dataset, "load_state_dict", None)):
        return False
    try:
        params = inspect.signature(dataset.state_dict).parameters
    except (TypeError, ValueError, AttributeError):
        return False
    return {"num_samples", "from_beginning"} <= set(params)


def _resume_loader_state(dataloader: Any, state: Any, batch_in_epoch: int) -> Iterator[Any]:
    """A duck-typed loader's epoch after ``load_state_dict(state)``. Mid-epoch, the torch RNG
    is left as it was by creating the iterator and fetching its first batch (the
    uninterrupted run created this epoch's iterator, and drew from the RNG for its workers'
    seed, before the checkpoint; a generator-based ``__iter__``, as streaming's, draws at its
    first batch); at an epoch boundary the new epoch draws as the uninterrupted run's would."""
    dataloader.load_state_dict(state)
    if batch_in_epoch == 0:
        return iter(dataloader)
    return _rng_neutral_start(dataloader)


def _rng_neutral_start(dataloader: Any) -> Iterator[Any]:
    """``iter(dataloader)``, with the torch RNG put back after the iterator is made and its
    first batch fetched."""
    torch_state = torch.get_rng_state()
    iterator = iter(dataloader)
    try:
        first = next(iterator)
    except StopIteration:
        torch.set_rng_state(torch_state)
        return
    torch.set_rng_state(torch_state)
    yield first
    yield from iterator


def _generators(dataloader: DataLoader) -> list[torch.Generator]:
    """The torch Generators the loader's epoch draws from (the loader's, its sampler's and
    its batch sampler's sampler's), each once, in a fixed order."""
    found: list[torch.Generator] = []
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    for owner in (dataloader, getattr(dataloader, "sampler", None), batch_sampler,
                  getattr(batch_sampler, "sampler", None)):
        gen = getattr(owner, "generator", None)
        if isinstance(gen, torch.Generator) and gen.device.type == "cpu" and not any(
                gen is g for g in found):
            found.append(gen)
    return found


def _draw_base_seed(generator: Optional[torch.Generator]) -> None:
    """The draw ``DataLoader`` makes for its workers' ``base_seed`` when an iterator is
    created (``_BaseDataLoaderIter.__init__``), from ``generator`` or the global RNG."""
    torch.empty((), dtype=torch.int64).random_(generator=generator)


def _seed_generator(state: torch.Tensor) -> torch.Generator:
    generator = torch.Generator()
    generator.set_state(state)
    return generator


def _persistent(dataloader: DataLoader) -> bool:
    return bool(dataloader.persistent_workers and dataloader.num_workers > 0)


# ---------------------------------------------------------------------------- the epoch
def iter_epoch(dataloader: Any, epoch: int, batch_in_epoch: int,
               length: Optional[int]) -> tuple[Iterator[Any], Optional[int]]:
    """An iterator over the rest of ``dataloader``'s current epoch, and how many batches it
    will yield (None if unknown).

    Call once per epoch, after the sampler's ``set_epoch``. At ``batch_in_epoch == 0`` this is
    ``iter(dataloader)``, with the RNG states it is created from recorded for the checkpoint;
    after a resume mid-epoch it continues the epoch exactly (see the module docstring).

    Args:
        dataloader: the train dataloader (any iterable).
        epoch: the epoch being iterated (``int(state.timestamp.epoch)``).
        batch_in_epoch: batches of this epoch already consumed (before a checkpoint).
        length: ``len(dataloader)`` if it has one, else None.
    """
    tracker = _tracker(dataloader)
    restored = None if tracker is None else tracker.restored
    if tracker is not None:
        tracker.restored = None
    remaining = None if length is None else max(0, length - batch_in_epoch)
    if restored is not None and restored.get("kind") == "stateful" and _is_stateful_loader(
            dataloader):
        return _resume_stateful(dataloader, restored["state"], batch_in_epoch), remaining
    if restored is not None and restored.get("kind") == "loader_state" and has_loader_state(
            dataloader):
        return _resume_loader_state(dataloader, restored["state"], batch_in_epoch), remaining
    if (restored is not None and restored.get("kind") == "dataset_state"
            and has_dataset_state(dataloader) and batch_in_epoch > 0):
        dataloader.dataset.load_state_dict(restored["state"])  # it skips the consumed samples
        return _rng_neutral_start(dataloader), remaining
    if restored is not None and restored.get("kind") == "origin" and isinstance(
            dataloader, DataLoader) and tracker is not None:
        _restore_generators(dataloader, restored, batch_in_epoch)
        if restored.get("seed_source") is not None:
            tracker.seed_source = restored["seed_source"]
        if batch_in_epoch > 0:
            if restored.get("epoch") == epoch:
                return _resume_dataloader(dataloader, tracker, restored, batch_in_epoch,
                                          length)
            log.warning("The checkpoint's data position is for epoch %s, the timestamp says "
                        "epoch %d: skipping %d batches without the recorded RNG state (the "
                        "order may differ from the uninterrupted run).", restored.get("epoch"),
                        epoch, batch_in_epoch)
    if batch_in_epoch > 0:  # no usable record (an older checkpoint, another world size...)
        return skip_consumed_batches(dataloader, batch_in_epoch)
    if tracker is None or not isinstance(dataloader, DataLoader) or _is_stateful_loader(
            dataloader) or has_loader_state(dataloader):
        return iter(dataloader), length
    return _start_epoch(dataloader, tracker, epoch), length


def _start_epoch(dataloader: DataLoader, tracker: _Tracker, epoch: int) -> Iterator[Any]:
    """``iter(dataloader)``, recording the RNG states it is created from."""
    torch_state = torch.get_rng_state()
    generator_states = [g.get_state() for g in _generators(dataloader)]
    seed_state = (dataloader.generator.get_state() if dataloader.generator is not None
                  else torch_state)
    reused_before = tracker.iterator is not None and _persistent(dataloader)
    if _persistent(dataloader) and tracker.iterator is None and tracker.seed_source is not None:
        # the uninterrupted run created its persistent iterator in an earlier epoch: its
        # workers' seed comes from that epoch's record, and no new draw is made now
        own = dataloader.generator
        dataloader.generator = _seed_generator(tracker.seed_source)
        try:
            iterator = iter(dataloader)
        finally:
            dataloader.generator = own
        drew_seed = False
    else:
        iterator = iter(dataloader)
        drew_seed = not (reused_before and iterator is tracker.iterator)
        if drew_seed:
            tracker.seed_source = seed_state
    tracker.iterator = iterator
    tracker.origin = {"kind": "origin", "epoch": epoch, "torch": torch_state,
                      "generators": generator_states, "drew_seed": drew_seed,
                      "seed_source": tracker.seed_source}
    return iterator


def _restore_generators(dataloader: DataLoader, restored: dict[str, Any],
                        batch_in_epoch: int) -> None:
    """At an epoch boundary, the loader's generators continue from the checkpoint's state;
    mid-epoch, from the epoch's start (the epoch is then recreated from it)."""
    states = restored["generators"] if batch_in_epoch > 0 else restored["generators_now"]
    generators = _generators(dataloader)
    if len(states) != len(generators):
        log.warning("The checkpoint recorded %d generators of the train dataloader, this run's "
                    "has %d: they are not restored.", len(states), len(generators))
        return
    for generator, state in zip(generators, states):
        generator.set_state(state)


class RemainingIndices(Sampler[Any]):
    """The indices (or index batches) of ``source`` after its first ``skip``.

    Args:
        source: a sampler, iterated when this is (its randomness is then drawn, as for the
            epoch it stands for); or an iterator already advanced past the consumed indices
            (``skip`` 0).
        skip: how many of ``source``'s indices to drop from the front.
        length: how many it yields, if known (``len()`` raises ``TypeError`` otherwise).
    """

    def __init__(self, source: Iterable[Any], skip: int = 0,
                 length: Optional[int] = None) -> None:
        self.source, self.skip, self.length = source, skip, length

    def __iter__(self) -> Iterator[Any]:
        if self.skip == 0:
            return iter(self.source)
        indices = list(iter(self.source))  # indices only: no sample is loaded here
        return iter(indices[self.skip:])

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("the remaining sampler has no length")
        return self.length


def _loader_options(dataloader: DataLoader) -> dict[str, Any]:
    """The constructor arguments of ``dataloader`` besides its dataset, index order and
    generator (``persistent_workers`` stays off: a rebuilt loader serves one partial epoch)."""
    options: dict[str, Any] = {
        "num_workers": dataloader.num_workers, "collate_fn": dataloader.collate_fn,
        "pin_memory": dataloader.pin_memory, "timeout": dataloader.timeout,
        "worker_init_fn": dataloader.worker_init_fn,
        "multiprocessing_context": dataloader.multiprocessing_context,
        "pin_memory_device": dataloader.pin_memory_device,
    }
    if dataloader.num_workers > 0:
        options["prefetch_factor"] = dataloader.prefetch_factor
    if hasattr(dataloader, "in_order"):
        options["in_order"] = dataloader.in_order
    return options


def rebuild_dataloader(dataloader: DataLoader, indices: Sampler[Any],
                       generator: Optional[torch.Generator]) -> DataLoader:
    """``dataloader`` over other indices: the same dataset and constructor arguments
    (workers, ``collate_fn``, ``pin_memory``, ``timeout``, ``worker_init_fn``,
    ``multiprocessing_context``, ``prefetch_factor``...; not ``persistent_workers``), with
    ``indices`` as its batch sampler when it has one (index batches), else as its sampler.

    Args:
        dataloader: the loader to rebuild.
        indices: the index batches (or, for a loader without a batch sampler, the indices)
            to load, e.g. a :class:`RemainingIndices`.
        generator: the generator the workers' ``base_seed`` is drawn from (None: the global
            torch RNG).
    """
    if dataloader.batch_sampler is not None:
        return DataLoader(dataloader.dataset, batch_sampler=indices, generator=generator,
                          **_loader_options(dataloader))
    return DataLoader(dataloader.dataset, batch_size=None, sampler=indices, generator=generator,
                      **_loader_options(dataloader))


def _resume_dataloader(dataloader: DataLoader, tracker: _Tracker, origin: dict[str, Any],
                       skip: int, length: Optional[int]) -> tuple[Iterator[Any], Optional[int]]:
    """The rest of the epoch ``origin`` recorded, ``skip`` batches in."""
    tracker.origin = origin  # a checkpoint later in this epoch records the same start
    now = torch.get_rng_state()
    try:
        torch.set_rng_state(origin["torch"])
        if isinstance(dataloader.dataset, IterableDataset):
            log.warning("Resuming mid-epoch by replaying %d batches of a DataLoader over an "
                        "IterableDataset (use torchdata's StatefulDataLoader to resume without "
                        "replay).", skip)
            iterator = iter(dataloader)
            for _ in range(skip):
                next(iterator)
            return iterator, None if length is None else max(0, length - skip)
        if origin["drew_seed"]:
            _draw_base_seed(dataloader.generator)  # as the epoch's iter() did, before sampling
        index_sampler: Any = (dataloader.batch_sampler if dataloader.batch_sampler is not None
                              else dataloader.sampler)
        indices = iter(index_sampler)
        for consumed in range(skip):
            try:
                next(indices)
            except StopIteration:
                raise ValueError(
                    f"The checkpoint is {skip} batches into the epoch, but the train "
                    f"dataloader's epoch has only {consumed} batches: the dataset or batch "
                    f"size changed since the checkpoint.") from None
    finally:
        torch.set_rng_state(now)
    total = len(index_sampler) if isinstance(index_sampler, Sized) else None
    rest = RemainingIndices(indices, length=None if total is None else max(0, total - skip))
    seed_source = origin.get("seed_source")
    generator = _seed_generator(seed_source) if seed_source is not None else None
    resumed = rebuild_dataloader(dataloader, rest, generator)
    now = torch.get_rng_state()
    iterator = iter(resumed)  # draws the workers' base_seed from ``generator`` only
    torch.set_rng_state(now)
    return iterator, rest.length


def skip_consumed_batches(dataloader: Any, batches: int) -> tuple[Iterator[Any], Optional[int]]:
    """An iterator over ``dataloader``'s current epoch after its first ``batches`` batches,
    and how many batches it will yield (None if unknown).

    The torch RNG is left as it was: creating a DataLoader iterator draws a seed from it,
    which the uninterrupted run did at the start of the epoch, before the checkpoint.

    The fallback of :func:`iter_epoch` when the checkpoint has no data position for this
    rank (an older checkpoint, another world size): a ``DataLoader`` with a plain
    ``BatchSampler`` over a map-style dataset is rebuilt over its sampler's indices minus the
    consumed prefix (exact for a seeded sampler, ``cadence.dist.get_sampler``; a
    ``RandomSampler`` draws its order anew, warned); any other iterable (a ``DataLoader`` over
    an ``IterableDataset`` included: it has no indices to skip) is advanced batch by batch
    (warned).
    """
    rng = torch.get_rng_state()
    if (isinstance(dataloader, DataLoader) and isinstance(dataloader.batch_sampler, BatchSampler)
            and type(dataloader.batch_sampler) is BatchSampler
            and not isinstance(dataloader.dataset, IterableDataset)):
        if isinstance(dataloader.batch_sampler.sampler, RandomSampler):
            log.warning("Resuming mid-epoch without the checkpoint's data position (an older "
                        "checkpoint, or another world size): the RandomSampler draws a new "
                        "order for the rest of this epoch, so some of its samples may be seen "
                        "twice and others not at all.")
        sampler = dataloader.batch_sampler.sampler
        batch_size = dataloader.batch_sampler.batch_size
        skip = batches * batch_size
        rest = RemainingIndices(sampler, skip, max(0, len(sampler) - skip))  # type: ignore[arg-type]
        resumed = rebuild_dataloader(
            dataloader, BatchSampler(rest, batch_size, dataloader.batch_sampler.drop_last),
            dataloader.generator)
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


def _resume_stateful(dataloader: Any, state: dict[str, Any], batch_in_epoch: int
                     ) -> Iterator[Any]:
    """A StatefulDataLoader's iterator restored from ``state``, without drawing from the RNGs
    (the uninterrupted run drew when it created the epoch's iterator, before the checkpoint).
    At an epoch boundary, the next epoch's iterator, created after the restored one (whose
    sampler and dataset state it continues) is exhausted."""
    torch_state = torch.get_rng_state()
    dataloader.load_state_dict(state)
    dataloader.state_dict()  # creates the restored iterator (and draws a base seed)
    torch.set_rng_state(torch_state)  # (generators stay as the restored sampler set them)
    iterator = iter(dataloader)  # the restored iterator, or a new one if it had finished
    if batch_in_epoch > 0 or state.get("_iterator_finished", False):
        return iterator
    try:  # a sized epoch ends without the StopIteration that marks the iterator finished
        next(iterator)
        log.warning("The StatefulDataLoader's state at this epoch boundary was not at the "
                    "end of its epoch; a new epoch starts anyway.")
    except StopIteration:
        pass
    # a new epoch's iterator: one draw, from the checkpoint's RNG state, as uninterrupted
    return iter(dataloader)


# ---------------------------------------------------------------------------- checkpoint
def _local_position(dataloader: Any, sample_in_epoch: int = 0) -> dict[str, Any]:
    if _is_stateful_loader(dataloader):
        return {"kind": "stateful", "state": dataloader.state_dict()}
    if has_loader_state(dataloader):
        return {"kind": "loader_state", "state": dataloader.state_dict()}
    if has_dataset_state(dataloader) and sample_in_epoch > 0:
        return {"kind": "dataset_state",
                "state": dataloader.dataset.state_dict(num_samples=sample_in_epoch,
                                                       from_beginning=True)}
    tracker = _TRACKERS.get(dataloader) if dataloader is not None else None
    if tracker is None or tracker.origin is None or not isinstance(dataloader, DataLoader):
        return {"kind": "none"}
    return {**tracker.origin,
            "generators_now": [g.get_state() for g in _generators(dataloader)]}


def save_data_position(state: Any) -> list[dict[str, Any]]:
    """Every rank's train dataloader position (a collective: every rank calls it), as plain
    values and tensors (loadable with ``torch.load(weights_only=True)``)."""
    try:
        timestamp = getattr(state, "timestamp", None)
        local = _local_position(state.train_dataloader,
                                0 if timestamp is None else int(timestamp.sample_in_epoch))
    except TypeError:  # not weak-referenceable
        local = {"kind": "none"}
    return dist.all_gather_object(local)


def load_data_position(state: Any, saved: Optional[list[dict[str, Any]]]) -> None:
    """Keep this rank's entry of ``saved`` (from :func:`save_data_position`) for the next
    :func:`iter_epoch` of ``state.train_dataloader``. From another world size, the state of
    a loader or dataset that keeps its own (global) position is restored from rank 0's
    entry on every rank; any other record is dropped (the epoch's consumed batches are then
    skipped by :func:`skip_consumed_batches`). A checkpoint without the entry leaves the
    dataloader as built."""
    if not saved or state.train_dataloader is None:
        return
    if len(saved) != dist.get_world_size() and (
            (saved[0].get("kind") == "loader_state" and has_loader_state(state.train_dataloader))
            or (saved[0].get("kind") == "dataset_state"
                and has_dataset_state(state.train_dataloader))):
        log.info("The checkpoint's data position is for %d ranks, this run has %d: the train "
                 "dataloader's own state (rank 0's) is restored on every rank.", len(saved),
                 dist.get_world_size())
        tracker = _tracker(state.train_dataloader)
        if tracker is not None:
            tracker.restored = dict(saved[0])
        return
    if len(saved) != dist.get_world_size():
        log.info("The checkpoint's data position is for %d ranks, this run has %d: each rank "
                 "skips its consumed batches in its own order.", len(saved),
                 dist.get_world_size())
        return
    tracker = _tracker(state.train_dataloader)
    entry = saved[dist.get_global_rank()]
    if tracker is not None and entry.get("kind") != "none":
        tracker.restored = dict(entry)
