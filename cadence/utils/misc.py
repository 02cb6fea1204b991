"""``create_interval_scheduler``: a ``(state, event) -> bool`` that is true every
``interval`` (and at the end of training), for ``save_interval`` and ``eval_interval``;
``interval_crossed``: the rule it applies (also the Trainer's ``eval_interval`` and
``log_interval``, and the console's);
``add_vision_dataset_transform``: a transform added to a dataset's ``transform`` pipeline;
``unwrap_model``: the user's model inside a ``DistributedDataParallel`` wrapper (the one
place that unwraps DDP; ``cadence.parallel.unwrap_model`` is this function).

Source: MosaicML Composer's ``create_interval_scheduler`` and
``add_vision_dataset_transform`` (``composer/utils/misc.py``): same arguments, defaults and
semantics (torchvision is not needed: see :func:`add_vision_dataset_transform`).
"""

from __future__ import annotations

import math
import string
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from torch import nn

from cadence.core.event import Event
from cadence.core.time import Time, TimeUnit

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["add_vision_dataset_transform", "create_interval_scheduler", "interval_crossed",
           "partial_format", "unwrap_model"]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's model: ``model.module`` if ``model`` is a ``DistributedDataParallel``
    wrapper, else ``model`` itself (FSDP2 and tensor parallelism shard the model in place, so
    a sharded model is the user's model).

    Args:
        model: the model as the run holds it (``state.model``), wrapped or not.

    Returns:
        The module whose parameter names and attributes are the user's (no ``module.``
        prefix).
    """
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def interval_crossed(state: State, interval: Time) -> bool:
    """Whether the count in ``interval``'s unit crossed a multiple of ``interval`` between
    ``state.previous_timestamp`` (before the last batch; a count of 0 when unset) and
    ``state.timestamp``: the one rule behind ``save_interval``, ``eval_interval`` and
    ``log_interval``.

    ``ep``, ``ba``, ``sp``, ``tok``, ``iter`` and ``sec`` count the timestamp's own field
    (``sec``: whole seconds of ``total_wct``); ``dur`` is a fraction of ``max_duration``,
    counted in its unit, rounded up, and in batches when ``max_duration`` is in epochs (so an
    epoch's fraction can end mid-epoch). A step of 0 never crosses. Epochs cross once the
    timestamp has moved to the next epoch (at ``EPOCH_END``), not on the epoch's last batch.

    Raises:
        RuntimeError: a ``dur`` interval with ``max_duration`` in epochs and an unsized
            dataloader.
    """
    unit = interval.unit
    if unit != TimeUnit.DURATION:
        step = float(interval.value)
    else:
        assert state.max_duration is not None, "a 'dur' interval needs max_duration"
        unit = state.max_duration.unit
        if unit == TimeUnit.EPOCH:  # count batches: an epoch fraction ends mid-epoch
            length = state.dataloader_len
            if length is None:
                raise RuntimeError(f"An interval in 'dur' ({interval}) with max_duration in "
                                   f"epochs needs a sized dataloader.")
            unit = TimeUnit.BATCH
            step = math.ceil(float(state.max_duration.value) * float(interval.value)
                             * int(length))
        else:
            step = math.ceil(float(state.max_duration.value) * float(interval.value))
    if step <= 0:
        return False
    previous = getattr(state, "previous_timestamp", None)
    before = 0.0 if previous is None else float(previous.get(unit).value)
    now = float(state.timestamp.get(unit).value)
    return math.floor(before / step) != math.floor(now / step)


def create_interval_scheduler(
    interval: Union[str, int, Time],
    include_end_of_training: bool = True,
    checkpoint_events: bool = True,
    final_events: Optional[set[Event]] = None,
) -> Callable[[State, Event], bool]:
    """A function ``(state, event) -> bool`` that is true on the event that ends each
    ``interval``, and (with ``include_end_of_training``) on a final event once training is
    done.

    Args:
        interval: an ``int`` (epochs), a time string or :class:`~cadence.Time` in ``ep``,
            ``ba``, ``sp``, ``tok``, ``iter``, ``sec`` or ``dur``. True when the count in that
            unit crossed a multiple of ``interval`` during the last batch (``dur``: a
            fraction of ``max_duration``, in its unit). ``0`` (not ``dur``) is never true.
        include_end_of_training: also true on a ``final_events`` event once
            ``state.get_elapsed_duration() >= 1``, unless this batch already fired.
        checkpoint_events: fire on ``EPOCH_CHECKPOINT`` / ``BATCH_CHECKPOINT`` (default, for
            saving); else on ``EPOCH_END`` / ``BATCH_END`` (for evaluation).
        final_events: the events the end of training is checked on; default
            ``{BATCH_CHECKPOINT, EPOCH_CHECKPOINT}``.

    Returns:
        The scheduler; pass it as ``save_interval`` or ``eval_interval``.

    Raises:
        ValueError: an interval in an unknown unit.
        RuntimeError (when called): a ``dur`` interval with an unsized dataloader and
            ``max_duration`` in epochs.
    """
    if final_events is None:
        final_events = {Event.BATCH_CHECKPOINT, Event.EPOCH_CHECKPOINT}
    time_interval = Time.from_input(interval, TimeUnit.EPOCH)
    unit = time_interval.unit
    if unit in (TimeUnit.EPOCH, TimeUnit.ITERATION):
        interval_event = Event.EPOCH_CHECKPOINT if checkpoint_events else Event.EPOCH_END
    elif unit in (TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN, TimeUnit.DURATION,
                  TimeUnit.SECOND):
        interval_event = Event.BATCH_CHECKPOINT if checkpoint_events else Event.BATCH_END
    else:
        raise ValueError(f"create_interval_scheduler: unknown unit of {interval!r}; use ep, "
                         f"ba, sp, tok, iter, sec or dur.")
    last_batch_seen = -1

    def check_interval(state: State, event: Event) -> bool:
        nonlocal last_batch_seen
        if unit != TimeUnit.DURATION and time_interval.value <= 0:
            return False
        previous = getattr(state, "previous_timestamp", None)
        if previous is None:  # training has not stepped yet
            return False
        elapsed = state.get_elapsed_duration()
        assert elapsed is not None, "an interval scheduler needs max_duration"
        batch = int(state.timestamp.batch)
        if (include_end_of_training and event in final_events and float(elapsed) >= 1.0
                and batch != last_batch_seen):
            last_batch_seen = batch
            return True
        if event != interval_event:
            return False
        if interval_crossed(state, time_interval):
            last_batch_seen = batch
            return True
        return False

    return check_interval


_TO_TENSOR_NAMES = ("ToTensor", "PILToTensor")


class _Composed:
    """``transforms`` applied in order (the list a dataset's plain callable ``transform`` is
    turned into when :func:`add_vision_dataset_transform` adds one)."""

    def __init__(self, transforms: list[Callable[[Any], Any]]) -> None:
        self.transforms = transforms

    def __call__(self, image: Any) -> Any:
        for transform in self.transforms:
            image = transform(image)
        return image

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.transforms!r})"


def add_vision_dataset_transform(dataset: Any, transform: Callable[[Any], Any],
                                 is_tensor_transform: bool = False) -> None:
    """Add ``transform`` to ``dataset.transform``, in place.

    Where it goes: a transform on ``PIL`` images (``is_tensor_transform=False``) goes just
    before the pipeline's ``ToTensor`` / ``PILToTensor`` step (recognised by class name), a
    tensor transform just after it; with no such step, at the end. ``dataset.transform``
    may be ``None`` (``transform`` becomes it), a ``Compose``-like object with a
    ``transforms`` list (a torchvision ``Compose``; inserted into that list), a list of
    transforms (inserted into it; the dataset applies the list itself), or any other
    callable (it and ``transform`` are wrapped into a small composed callable: ``transform``
    first for ``PIL`` transforms, last for tensor transforms).

    Args:
        dataset: a dataset with a ``transform`` attribute (a torchvision ``VisionDataset``,
            or any dataset that applies ``self.transform`` to its images).
        transform: ``image -> image``.
        is_tensor_transform: whether ``transform`` takes tensors (else ``PIL`` images).

    Raises:
        TypeError: ``dataset`` has no ``transform`` attribute, or it is neither ``None``, a
            list, a ``Compose``-like object nor a callable.
    """
    if not hasattr(dataset, "transform"):
        raise TypeError(
            f"add_vision_dataset_transform: {type(dataset).__name__} has no 'transform' "
            f"attribute. Give the dataset a 'transform' (None, a callable or a list of "
            f"transforms) that its __getitem__ applies to each image.")
    current = dataset.transform
    if current is None:
        dataset.transform = transform
        return
    steps = current if isinstance(current, list) else getattr(current, "transforms", None)
    if isinstance(steps, list):
        names = [type(step).__name__ for step in steps]
        where = next((i for i, name in enumerate(names) if name in _TO_TENSOR_NAMES), None)
        if where is None:
            steps.append(transform)
        else:
            steps.insert(where + 1 if is_tensor_transform else where, transform)
        return
    if not callable(current):
        raise TypeError(
            f"add_vision_dataset_transform: {type(dataset).__name__}.transform is a "
            f"{type(current).__name__}; expected None, a callable, a list of transforms or "
            f"a Compose-like object with a 'transforms' list.")
    dataset.transform = _Composed([current, transform] if is_tensor_transform
                                  else [transform, current])


def partial_format(template: str, **values: Any) -> str:
    """Fill the fields of ``template`` named in ``values``; leave the others as written
    (Composer formats a load path this way). A path that is not a valid template (a lone
    brace) is returned as is."""
    out = []
    try:
        for literal, field, spec, conversion in string.Formatter().parse(template):
            out.append(literal)
            if field is None:
                continue
            text = ("{" + field + (f"!{conversion}" if conversion else "")
                    + (f":{spec}" if spec else "") + "}")
            out.append(text.format(**values) if field in values else text)
    except ValueError:
        return template
    return "".join(out)
