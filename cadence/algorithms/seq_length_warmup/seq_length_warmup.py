"""Sequence length warm-up: train on short sequences first, lengthening them step by step.

Shapes: ``B`` = samples, ``T`` = the dataloader's sequence length, ``L`` = the current
sequence length (``L <= T``).

Source: Li, Zhang and He, "The Stability-Efficiency Dilemma: Investigating Sequence Length
Warmup for Training GPT Models", NeurIPS 2022 (arXiv:2108.06084); MosaicML Composer's
``SeqLengthWarmup`` / ``set_batch_sequence_length``
(``composer/algorithms/seq_length_warmup/seq_length_warmup.py``): same arguments, defaults,
event and schedule.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import torch

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State, TimeUnit

__all__ = ["SeqLengthWarmup", "set_batch_sequence_length"]


def _sequence_length(batch: Mapping[str, torch.Tensor]) -> int:
    """The second dimension of the batch's first tensor with two or more dimensions (0 if none)."""
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.ndim > 1:
            return int(value.shape[1])
    return 0


def _require_sequences(batch: Mapping[str, Any]) -> None:
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor) or value.ndim < 2:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(
                f"set_batch_sequence_length: every batch value must be a [batch, seq, ...] tensor "
                f"when truncating; {key!r} is {shape}. Drop it from the batch (or collate it "
                f"per token).")


def set_batch_sequence_length(batch: MutableMapping[str, torch.Tensor], curr_seq_len: int,
                              truncate: bool = True,
                              preserve_end_of_sequence: bool = False) -> MutableMapping[str, Any]:
    """Change every tensor of a dict batch to sequence length ``curr_seq_len``.

    ``truncate=True``: each ``[B, T, ...]`` tensor becomes ``[B, L, ...]`` (its first ``L``
    positions). With ``preserve_end_of_sequence`` each row's last real token (position
    ``attention_mask.sum(1) - 1``) is written into the last kept position when it was cut,
    so an end-of-sequence token survives: ``[[10, 11, 12, 13, 14, 15]]`` at ``L = 3`` becomes
    ``[[10, 11, 15]]`` instead of ``[[10, 11, 12]]``.

    ``truncate=False``: no token is dropped except a tail; the ``B * T`` tokens of each
    tensor are laid end to end and cut into rows of ``L``: ``[B, T]`` becomes
    ``[(B * T) // L, L]`` (the last ``B * T mod L`` tokens are dropped). Every tensor must have
    ``input_ids``' shape, and no padding may be present (rows would mix documents' padding).

    A batch whose sequences are not longer than ``curr_seq_len`` is returned unchanged. The
    batch is changed in place (and returned).

    Args:
        batch: a mapping of ``[B, T]`` (or ``[B, T, ...]``) tensors (``input_ids``,
            ``labels``, ``attention_mask``, ...).
        curr_seq_len: the sequence length ``L`` to set; > 0.
        truncate: cut each row (default), or reshape into more, shorter rows.
        preserve_end_of_sequence: keep each row's last real token when truncating (needs
            ``attention_mask``); ignored with ``truncate=False``. Default False.

    Returns:
        ``batch``, with the new tensors.

    Raises:
        TypeError: ``batch`` is not a mapping.
        ValueError: ``curr_seq_len`` < 1; a value that is not a ``[B, T, ...]`` tensor when
            truncating; no ``attention_mask`` with ``preserve_end_of_sequence``; no
            ``input_ids``, a tensor of another shape, or padding with ``truncate=False``.
    """
    if not isinstance(batch, MutableMapping):
        raise TypeError(f"set_batch_sequence_length needs a dict batch ({{'input_ids': ...}}), "
                        f"got {type(batch).__name__}.")
    if isinstance(curr_seq_len, bool) or int(curr_seq_len) != curr_seq_len or curr_seq_len < 1:
        raise ValueError(f"curr_seq_len must be a positive integer, got {curr_seq_len!r}.")
    curr_seq_len = int(curr_seq_len)
    if curr_seq_len >= _sequence_length(batch):
        return batch
    if not truncate:
        return _reshape(batch, curr_seq_len)
    _require_sequences(batch)
    if not preserve_end_of_sequence:
        for key in list(batch.keys()):
            batch[key] = batch[key][:, :curr_seq_len].contiguous()
        return batch
    if "attention_mask" not in batch:
        raise ValueError("set_batch_sequence_length: preserve_end_of_sequence=True needs "
                         "batch['attention_mask'] to find each row's last token; add it or pass "
                         "preserve_end_of_sequence=False.")
    mask = batch["attention_mask"]
    rows = torch.arange(mask.shape[0], device=mask.device)
    last = mask.sum(dim=1).long() - 1  # [B]: each row's last real position
    last_kept = last.clamp(max=curr_seq_len - 1)
    for key in list(batch.keys()):
        value = batch[key]
        end = value[rows, last]  # [B, ...]
        value = value[:, :curr_seq_len].contiguous()
        value[rows, last_kept] = end
        batch[key] = value
    return batch


def _reshape(batch: MutableMapping[str, Any], curr_seq_len: int) -> MutableMapping[str, Any]:
    if "input_ids" not in batch:
        raise ValueError("set_batch_sequence_length: truncate=False needs batch['input_ids'] "
                         f"(batch keys: {sorted(batch)}).")
    shape = batch["input_ids"].shape
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and not bool(mask.all()):
        raise ValueError("set_batch_sequence_length: truncate=False cannot reshape a padded batch "
                         "(attention_mask has zeros); use truncate=True.")
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor) or value.shape != shape:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"set_batch_sequence_length: truncate=False needs every tensor shaped "
                             f"like input_ids {tuple(shape)}; {key!r} is {got}.")
    kept = (shape.numel() // curr_seq_len) * curr_seq_len
    for key in list(batch.keys()):
        batch[key] = batch[key].reshape(-1)[:kept].view(-1, curr_seq_len)
    return batch


@algorithms.register("seq_length_warmup")
class SeqLengthWarmup(Algorithm):
    """Grows the training sequence length from ``min_seq_length`` to ``max_seq_length``
    over the first ``duration`` of training (Li et al. 2022), then keeps it at the maximum.

    At ``AFTER_DATALOADER`` each device batch ``{"input_ids": [B, T], ...}`` becomes
    ``[B, L]`` (``truncate``) or ``[(B * T) // L, L]`` (reshape) with
    :func:`set_batch_sequence_length`. ``L`` rises by ``step_size`` every
    ``warmup_batches // ((max - min) // step_size)`` batches, where ``warmup_batches`` is
    ``duration`` times the run's length in batches (``max_duration`` in epochs or batches,
    as Composer); with ``max_duration`` in tokens or samples the schedule follows the elapsed
    fraction of training instead (Composer refuses those units). A warm-up shorter than the
    number of length steps takes several steps per batch (Composer divides by zero there).
    The schedule depends on the timestamp only, so a resumed run continues it exactly.

    The Trainer counts the timestamp's tokens after this event, so ``tok`` durations and
    throughput follow the tokens actually trained on.

    Composer runs one forward and backward pass at ``max_seq_length`` on the first batch to
    reserve memory; cadence does not: ``device_train_microbatch_size='auto'`` already
    retries any batch that runs out of memory at a smaller microbatch, the first
    full-length batch reserves the same memory anyway, and the extra pass would draw from
    the dropout RNG, so a resumed run (which would repeat it) would not match an
    uninterrupted one bit for bit.

    Args:
        duration: fraction of training spent warming up, in ``[0, 1]``; default 0.3.
        min_seq_length: first sequence length; default 8.
        max_seq_length: last sequence length; default 1024.
        step_size: increment of the length; a multiple of 8 suits GPU tensor cores;
            default 8.
        truncate: cut rows (default) or reshape the batch into more, shorter rows.
        preserve_end_of_sequence: keep each row's last real token when truncating;
            default False.

    Raises:
        ValueError: ``duration`` outside ``[0, 1]``; a length or step < 1; ``max_seq_length <
            min_seq_length``. At ``AFTER_DATALOADER``: a batch that is not a mapping, or as
            :func:`set_batch_sequence_length`.

    Example (YAML)::

        algorithms:
          seq_length_warmup: {duration: 0.3, min_seq_length: 8, max_seq_length: 1024}
    """

    events = frozenset({Event.AFTER_DATALOADER})

    def __init__(self, duration: float = 0.3, min_seq_length: int = 8,
                 max_seq_length: int = 1024, step_size: int = 8, truncate: bool = True,
                 preserve_end_of_sequence: bool = False) -> None:
        if not 0 <= duration <= 1:
            raise ValueError(f"SeqLengthWarmup: duration must be in [0, 1], got {duration}.")
        for name, value in (("min_seq_length", min_seq_length),
                            ("max_seq_length", max_seq_length), ("step_size", step_size)):
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"SeqLengthWarmup: {name} must be a positive integer, "
                                 f"got {value!r}.")
        if max_seq_length < min_seq_length:
            raise ValueError(f"SeqLengthWarmup: max_seq_length={max_seq_length} must be >= "
                             f"min_seq_length={min_seq_length}.")
        self.duration = float(duration)
        self.min_seq_length = int(min_seq_length)
        self.max_seq_length = int(max_seq_length)
        self.step_size = int(step_size)
        self.truncate = bool(truncate)
        self.preserve_end_of_sequence = bool(preserve_end_of_sequence)

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_DATALOADER

    def current_length(self, state: State) -> int:
        """The sequence length for the batch at ``state.timestamp``."""
        steps = (self.max_seq_length - self.min_seq_length) // self.step_size
        assert state.max_duration is not None, "max_duration is set before training"
        unit = state.max_duration.unit
        if unit in (TimeUnit.EPOCH, TimeUnit.BATCH):
            total = state.max_duration.value
            if unit == TimeUnit.EPOCH:
                if state.dataloader_len is None:
                    raise RuntimeError("SeqLengthWarmup with max_duration in epochs needs a "
                                       "sized train dataloader; give max_duration in batches.")
                total *= int(state.dataloader_len)
            warmup = int(total * self.duration)  # batches
            done = int(state.timestamp.batch)
        else:  # tokens or samples: the elapsed fraction, in millionths
            elapsed = state.get_elapsed_duration()
            warmup, done = 10**6, int(float(elapsed or 0.0) / max(self.duration, 1e-12) * 1e6)
            if self.duration == 0:
                warmup = 0
        if steps == 0 or warmup == 0:
            return self.max_seq_length
        every = warmup // steps
        increments = done // every if every >= 1 else done * steps // warmup
        return min(self.min_seq_length + self.step_size * increments, self.max_seq_length)

    def apply(self, event: Event, state: State, logger: Any) -> None:
        if not isinstance(state.batch, MutableMapping):
            raise TypeError(f"SeqLengthWarmup needs dict batches ({{'input_ids': [batch, seq], "
                            f"...}}); the train dataloader yields {type(state.batch).__name__}.")
        length = self.current_length(state)
        state.batch = set_batch_sequence_length(state.batch, length, self.truncate,
                                                self.preserve_end_of_sequence)
        if logger is not None:
            ids = state.batch.get("input_ids")
            size = int(ids.shape[0]) if isinstance(ids, torch.Tensor) else None
            logger.log_metrics({"seq_length_warmup/curr_seq_len": length,
                                "seq_length_warmup/curr_bs": size})
