"""ALiBi: attention with linear biases instead of position embeddings, trained on shorter
sequences than it is evaluated on.

Source: Press, Smith and Lewis, "Train Short, Test Long: Attention with Linear Biases
Enables Input Length Extrapolation", ICLR 2022 (https://arxiv.org/abs/2108.12409); the API
of Composer's ``Alibi`` / ``apply_alibi`` (``composer/algorithms/alibi/alibi.py``): same
names, arguments, defaults and events. The bias and the per-model surgery are in
:mod:`cadence.algorithms.alibi.attention_surgery_functions.utils`.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Mapping, MutableMapping, Sequence, Union

import torch
from torch import nn

from cadence.algorithms.alibi.attention_surgery_functions.utils import (
    AlibiPolicy,
    ZeroPositionEmbedding,
    resize_positions_buffer,
    policy_registry,
)
from cadence.algorithms.seq_length_warmup.seq_length_warmup import set_batch_sequence_length
from cadence.algorithms.warnings import NoEffectWarning
from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State
from cadence.utils import module_surgery

__all__ = ["Alibi", "apply_alibi"]

log = logging.getLogger(__name__)

Optimizers = Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]]


def _check_max_sequence_length(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_sequence_length must be a positive integer (the longest sequence "
                         f"the model will see, in training or evaluation), got {value!r}.")
    return value


def _model_name(model: nn.Module) -> str:
    inner = getattr(model, "model", None)
    name = type(model).__name__
    return f"{name} (wrapping {type(inner).__name__})" if isinstance(inner, nn.Module) else name


def _swap_position_embeddings(model: nn.Module, policies: Sequence[AlibiPolicy],
                              max_sequence_length: int, optimizers: Optimizers | None) -> int:
    """Replace each policy's position embedding by a zero, frozen one of
    ``max_sequence_length`` rows (the optimizers drop the old weight); resize the
    position-sized buffers next to it. Returns how many were replaced."""
    swaps: dict[nn.Module, nn.Module] = {}
    for owner in model.modules():
        for policy in policies:
            if not isinstance(owner, policy.embeddings):
                continue
            rows = max_sequence_length + policy.extra_positions(owner)
            old = getattr(owner, policy.position_embedding)
            if not isinstance(old, ZeroPositionEmbedding) or old.num_embeddings != rows:
                swaps[old] = ZeroPositionEmbedding(rows, old.embedding_dim,
                                                   dtype=old.weight.dtype)
            for name in policy.position_buffers:
                resize_positions_buffer(owner, name, rows)
            config = getattr(owner, "config", None)
            if config is not None and hasattr(config, "max_position_embeddings"):
                config.max_position_embeddings = rows
    if swaps:
        module_surgery.replace_module_classes(
            model, {nn.Embedding: lambda module, index: swaps.get(module)}, optimizers)
    return len(swaps)


def apply_alibi(
    model: nn.Module,
    max_sequence_length: int,
    optimizers: Optimizers | None = None,
) -> None:
    """Put ALiBi into ``model`` in place: attention biased by distance, position embeddings
    removed.

    Every self-attention module of a supported family (Hugging Face ``GPT2Attention``,
    ``BertSelfAttention``, ``RobertaSelfAttention``;
    :data:`~cadence.algorithms.alibi.attention_surgery_functions.utils.policy_registry`) is
    replaced by its ALiBi form, which shares its parameters and adds ``-m_h * (i - j)``
    (causal) or ``-m_h * |i - j|`` (BERT) to head ``h``'s logits, with slopes
    ``m_h = 2 ** (-8 h / H)``. The position embedding (GPT-2's ``wpe``, BERT's
    ``position_embeddings``) becomes a zero, frozen ``[max_sequence_length, d_model]`` one
    (:class:`~cadence.algorithms.alibi.attention_surgery_functions.utils.ZeroPositionEmbedding`), and BERT's
    ``position_ids`` / ``token_type_ids`` buffers are resized to ``max_sequence_length``, as
    is the model config's ``max_position_embeddings``. Applying it again changes nothing
    (or only the length).

    This does not shorten training sequences (the source of ALiBi's speed-up); the
    :class:`Alibi` algorithm does that. Call it before building the optimizer, or pass the
    optimizers, and before the model is wrapped or sharded.

    Args:
        model: the model (e.g. a :class:`~cadence.models.HuggingFaceModel` around a
            ``GPT2LMHeadModel`` or a BERT), modified in place; not yet parallelized.
        max_sequence_length: the longest sequence the model will accept after surgery, in
            tokens: set it to the longest evaluation length (ALiBi extrapolates beyond the
            training length); longer inputs raise ``ValueError``.
        optimizers: optimizers already built over ``model.parameters()``: the old position
            embedding weights leave them
            (:func:`~cadence.utils.module_surgery.update_params_in_optimizer`).

    Raises:
        TypeError: ``model`` has no module ALiBi has a policy for (the message names the
            model's type and the supported attention classes), or it is already wrapped or
            sharded (DDP, FSDP2).
        ValueError: ``max_sequence_length`` is not a positive integer, or the model's
            ``attn_implementation`` is neither ``"sdpa"`` nor ``"eager"``.
    """
    _check_max_sequence_length(max_sequence_length)
    policies = [p for p in policy_registry
                if any(isinstance(m, p.attention) for m in model.modules())]
    if not policies:
        supported = ", ".join(f"{p.attention.__module__}.{p.attention.__name__}"
                              for p in policy_registry)
        raise TypeError(
            f"apply_alibi: {_model_name(model)} has no ALiBi policy: none of its modules is a "
            f"supported attention class ({supported}). Add an AlibiPolicy for it to "
            f"cadence.algorithms.alibi.attention_surgery_functions.utils.policy_registry, or drop Alibi.")
    replaced = module_surgery.replace_module_classes(
        model, {p.attention: p.convert for p in policies}, optimizers)
    embeddings = _swap_position_embeddings(model, policies, max_sequence_length, optimizers)
    if not replaced and not embeddings:
        warnings.warn(NoEffectWarning(f"apply_alibi: ALiBi is already applied to "
                                      f"{_model_name(model)}; nothing changed."), stacklevel=2)
    log.info("ALiBi: %d attention modules converted, %d position embeddings removed "
             "(max_sequence_length=%d).", len(replaced), embeddings, max_sequence_length)


def _sequence_length(batch: Mapping[str, Any]) -> int:
    """The length (dimension 1) of ``input_ids``, else of the first 2-d+ tensor (0: none)."""
    ids = batch.get("input_ids")
    if isinstance(ids, torch.Tensor) and ids.ndim >= 2:
        return int(ids.shape[1])
    return next((int(v.shape[1]) for v in batch.values()
                 if isinstance(v, torch.Tensor) and v.ndim >= 2), 0)


@algorithms.register("alibi")
class Alibi(Algorithm):
    """ALiBi (Press et al. 2022, "Train Short, Test Long: Attention with Linear Biases
    Enables Input Length Extrapolation"): no position embeddings; each attention head adds a
    penalty linear in the query-key distance, so the model extrapolates to sequences longer
    than it was trained on, and it is trained on shorter ones.

    - ``INIT``: :func:`apply_alibi` (module surgery, before the Trainer parallelizes the
      model; the optimizers are updated).
    - ``AFTER_DATALOADER``: with ``train_sequence_length_scaling = s < 1``, each training
      batch tensor ``[B, L]`` becomes ``[(B L) // int(s L), int(s L)]``: the same tokens in
      more, shorter rows (Composer's reshape, done by
      :func:`~cadence.algorithms.seq_length_warmup.seq_length_warmup.set_batch_sequence_length` with
      ``truncate=False``; the last ``B L mod int(s L)`` tokens are dropped, none when
      ``int(s L)`` divides ``L``). Every value of the (dict) batch must be shaped like
      ``input_ids`` and unpadded; a non-dict batch is left as it is, with a warning.

    Args:
        max_sequence_length: the longest sequence the model accepts after surgery, training or
            evaluation (evaluate longer than trained by setting it to the evaluation length).
        train_sequence_length_scaling: the fraction of each training sequence kept per row,
            in ``(0, 1]``; default 0.25 (Composer's). 1.0 leaves batches unchanged.

    Raises:
        ValueError: ``max_sequence_length`` is not a positive integer, or
            ``train_sequence_length_scaling`` is outside ``(0, 1]``; at ``INIT``, as
            :func:`apply_alibi`; at ``AFTER_DATALOADER``, a batch value not shaped like
            ``input_ids``, or a padded batch (``attention_mask`` with zeros).

    Example (YAML)::

        algorithms:
          alibi: {max_sequence_length: 1024, train_sequence_length_scaling: 0.25}
    """

    events = frozenset({Event.INIT, Event.AFTER_DATALOADER})

    def __init__(self, max_sequence_length: int,
                 train_sequence_length_scaling: float = 0.25) -> None:
        self.max_sequence_length = _check_max_sequence_length(max_sequence_length)
        if isinstance(train_sequence_length_scaling, bool) or \
                not 0.0 < float(train_sequence_length_scaling) <= 1.0:
            raise ValueError(f"train_sequence_length_scaling must be in (0, 1] (the fraction of "
                             f"each training sequence kept), got "
                             f"{train_sequence_length_scaling!r}.")
        self.train_sequence_length_scaling = float(train_sequence_length_scaling)
        self._applied = False
        self._warned_batch = False

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_sequence_length={self.max_sequence_length}, "
                f"train_sequence_length_scaling={self.train_sequence_length_scaling})")

    def match(self, event: Event, state: State) -> bool:
        if event == Event.INIT:
            return not self._applied
        return event == Event.AFTER_DATALOADER and self.train_sequence_length_scaling != 1.0

    def apply(self, event: Event, state: State, logger: Any) -> None:
        if event == Event.INIT:
            apply_alibi(state.model, self.max_sequence_length, optimizers=state.optimizers)
            self._applied = True
            return
        if isinstance(state.batch, MutableMapping):
            length = _sequence_length(state.batch)
            try:  # SeqLengthWarmup's reshape: the same tokens in more, shorter rows
                state.batch = set_batch_sequence_length(
                    state.batch, max(1, int(length * self.train_sequence_length_scaling)),
                    truncate=False)
            except ValueError as exc:
                raise ValueError(f"{self!r} at AFTER_DATALOADER: {exc} Or set "
                                 f"train_sequence_length_scaling=1.0.") from None
        elif not self._warned_batch:
            self._warned_batch = True
            warnings.warn(NoEffectWarning(
                f"Alibi shortens dict batches only; the batch is a {type(state.batch).__name__}, "
                f"so train_sequence_length_scaling={self.train_sequence_length_scaling} is not "
                f"applied."), stacklevel=2)
