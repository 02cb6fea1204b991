"""Selective backprop: train each step on the samples the model currently gets most wrong.

Shapes: ``N`` = samples in the batch, ``K = int(keep * N)`` samples kept.

Source: Jiang et al., "Accelerating Deep Learning by Focusing on the Biggest Losers",
arXiv:1910.00762 (2019); MosaicML Composer's ``SelectiveBackprop`` / ``select_using_loss`` /
``should_selective_backprop`` (``composer/algorithms/selective_backprop/selective_backprop.py``):
same arguments, defaults, events and selection rule.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State, get_precision_context
from cadence.core.precision import Precision
from cadence.utils.batch_helpers import batch_get, batch_set
from cadence.utils.misc import unwrap_model

__all__ = ["SelectiveBackprop", "select_using_loss", "should_selective_backprop"]

_INTERPOLATE_MODES = {3: "linear", 4: "bilinear", 5: "trilinear"}


def should_selective_backprop(current_duration: float, batch_idx: int, start: float = 0.5,
                              end: float = 0.9, interrupt: int = 2) -> bool:
    """Whether this batch is pruned: inside ``[start, end)`` of training and not one of the
    interrupting full batches (every ``interrupt``-th batch of the epoch is trained whole;
    ``interrupt=0`` never interrupts).

    Args:
        current_duration: the elapsed fraction of training, in ``[0, 1]``.
        batch_idx: the batch's index within its epoch (from 0).
        start: first fraction of training that selects; default 0.5.
        end: fraction of training from which it stops; default 0.9.
        interrupt: every ``interrupt``-th batch (``(batch_idx + 1) % interrupt == 0``) is
            kept whole; default 2 (alternate).
    """
    in_interval = start <= current_duration < end
    return in_interval and (interrupt == 0 or (batch_idx + 1) % interrupt != 0)


def _selection_probabilities(n: int, keep: float) -> torch.Tensor:
    """``[n]`` sampling weights by loss rank (ascending): the rank's percentile raised to
    ``1 / keep - 1``, normalised (Jiang et al.'s selection by loss percentile)."""
    percentiles = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    weights = percentiles ** (1.0 / keep - 1.0)
    return weights / weights.sum()


def _select_indices(losses: torch.Tensor, keep: float) -> torch.Tensor:
    """``[K]`` indices into ``losses`` ``[N]``, drawn without replacement with probabilities
    that grow with the loss's rank (torch's global CPU RNG: checkpointed, reproducible)."""
    n = losses.shape[0]
    order = torch.argsort(losses)  # ascending: the last is the biggest loser
    draws = torch.multinomial(_selection_probabilities(n, keep), int(keep * n), replacement=False)
    return order[draws.to(order.device)]


def _check_keep(keep: float) -> None:
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep}.")


def _per_sample(losses: torch.Tensor, n: int) -> torch.Tensor:
    if losses.ndim == 0 or losses.shape[0] != n:
        raise ValueError(f"The loss function must return one loss per sample ([N={n}, ...]) "
                         f"with reduction='none'; got shape {tuple(losses.shape)}.")
    return losses.reshape(n, -1).float().mean(dim=1)


def select_using_loss(input: torch.Tensor, target: torch.Tensor, model: Callable[..., Any],
                      loss_fun: Callable[..., torch.Tensor], keep: float = 0.5,
                      scale_factor: float = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep ``int(keep * N)`` samples, favouring those with the highest loss.

    A no-grad forward pass scores each sample (``loss_fun(model(input), target,
    reduction='none')``, averaged per sample); samples are ranked by loss and drawn without
    replacement with probability proportional to ``percentile ** (1 / keep - 1)``, so the
    highest losses are the likeliest and, for small ``keep``, nearly always chosen.

    Args:
        input: ``[N, ...]`` inputs (images ``[N, C, H, W]``, token ids ``[N, T]``).
        target: ``[N, ...]`` targets.
        model: a callable from ``input`` to outputs.
        loss_fun: ``loss_fun(outputs, target, reduction='none')`` -> ``[N]`` or ``[N, ...]``.
        keep: fraction of samples kept, in ``(0, 1]``; default 0.5.
        scale_factor: scoring inputs are first resized by this factor (``< 1`` for a cheaper
            pass; 3-5-D inputs only); default 1.

    Returns:
        ``(input[idx], target[idx])``: ``[K, ...]`` each.

    Raises:
        ValueError: ``keep`` outside ``(0, 1]``; ``scale_factor != 1`` with an input that is
            not 3-, 4- or 5-D; a loss that is not per sample.
        TypeError: ``loss_fun`` is not callable or takes no ``reduction`` keyword (Composer's
            check and message).
    """
    if not callable(loss_fun):
        raise TypeError(f"Loss function must be callable, got {type(loss_fun).__name__}.")
    if not _takes_reduction(loss_fun):
        raise TypeError("Loss function `loss_fun` must take a keyword argument `reduction`. "
                        "SelectiveBackprop calls it with reduction='none' for per-sample losses.")
    idx = _score_and_select(input, target, model, loss_fun, keep, scale_factor)
    return input[idx], target[idx]


def _score_and_select(input: torch.Tensor, target: Any, model: Callable[..., Any],
                      loss_fun: Callable[..., torch.Tensor], keep: float,
                      scale_factor: float) -> torch.Tensor:
    _check_keep(keep)
    if scale_factor != 1 and input.dim() not in _INTERPOLATE_MODES:
        raise ValueError(f"scale_factor={scale_factor} resizes 3-, 4- or 5-D inputs only; the "
                         f"input is {input.dim()}-D {tuple(input.shape)}.")
    n = input.shape[0]
    with torch.no_grad():
        scored = input
        if scale_factor < 1:
            scored = F.interpolate(input, scale_factor=scale_factor,
                                   mode=_INTERPOLATE_MODES[input.dim()], align_corners=False,
                                   recompute_scale_factor=False)
        losses = _per_sample(loss_fun(model(scored), target, reduction="none"), n)
        return _select_indices(losses, keep)


def _token_losses(model: Any, outputs: Any, labels: torch.Tensor) -> torch.Tensor:
    """Per-sample loss of a Hugging Face-style output (``logits``): the mean cross entropy
    over each sample's counted tokens (``-100`` ignored; shifted for a causal LM)."""
    logits = outputs if isinstance(outputs, torch.Tensor) else (
        outputs["logits"] if isinstance(outputs, Mapping) else outputs.logits)
    if logits.dim() == 2:  # a classifier: [N, C] against [N]
        return F.cross_entropy(logits.float(), labels, reduction="none")
    if getattr(model, "shift_labels", False):
        logits, labels = logits[:, :-1], labels[:, 1:]
    per_token = F.cross_entropy(logits.float().transpose(1, -1), labels, reduction="none",
                                ignore_index=-100)  # [N, T]
    counted = labels.ne(-100).sum(dim=1).clamp(min=1)
    return per_token.sum(dim=1) / counted


def _takes_reduction(loss: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(loss).parameters
    except (TypeError, ValueError):
        return False
    return "reduction" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


@algorithms.register("selective_backprop")
class SelectiveBackprop(Algorithm):
    """Trains on the highest-loss samples of each batch (Jiang et al. 2019).

    At ``AFTER_DATALOADER``, for batches inside ``[start, end)`` of training that are not
    interrupting batches (:func:`should_selective_backprop`), a no-grad forward pass scores
    every sample and ``int(keep * N)`` of the ``N`` samples are kept (:func:`select_using_loss`):
    the batch's tensors ``[N, ...]`` become ``[K, ...]``; every per-sample tensor of a dict
    batch (``attention_mask`` too) is cut with the inputs and targets. The step then trains
    on the smaller batch; the timestamp counts the samples and tokens actually trained on.

    Per-sample losses come from ``model.loss(outputs, batch, reduction='none')`` when the
    model's ``loss`` takes ``reduction`` (Composer's contract), else, for a model whose
    outputs hold ``logits`` (:class:`~cadence.models.HuggingFaceModel`), from each sample's
    mean token cross entropy, shifted as a causal LM's loss is.

    The selection draws from torch's global RNG, which checkpoints save: a resumed run
    selects the same samples as an uninterrupted one. The algorithm holds no other state.

    Args:
        start: fraction of training at which selection starts; default 0.5.
        end: fraction of training at which it stops; default 0.9.
        keep: fraction of each batch kept, in ``(0, 1]``; default 0.5 (1 disables it).
        scale_factor: inputs are resized by this factor for scoring (images); default 1.
        interrupt: every ``interrupt``-th batch is trained whole (0: never); default 2.
        target_key: the targets in the batch (:func:`cadence.utils.batch_helpers.batch_get`);
            default ``1``; ``"labels"`` for a dict batch.
        input_key: the inputs; default ``0``; ``"input_ids"`` for a dict batch.

    Raises:
        ValueError: ``keep`` outside ``(0, 1]``; ``start``/``end`` outside ``[0, 1]`` or
            ``start > end``; ``interrupt < 0``. At ``AFTER_DATALOADER``: a key the batch
            lacks (the message names the batch's keys).

    Example (YAML)::

        algorithms:
          selective_backprop: {start: 0.5, end: 0.9, keep: 0.5,
                               input_key: input_ids, target_key: labels}
    """

    events = frozenset({Event.INIT, Event.AFTER_DATALOADER})

    def __init__(self, start: float = 0.5, end: float = 0.9, keep: float = 0.5,
                 scale_factor: float = 1.0, interrupt: int = 2, input_key: Any = 0,
                 target_key: Any = 1) -> None:
        _check_keep(keep)
        if not 0.0 <= start <= end <= 1.0:
            raise ValueError(f"SelectiveBackprop: need 0 <= start <= end <= 1, got start={start}, "
                             f"end={end}.")
        if isinstance(interrupt, bool) or int(interrupt) != interrupt or interrupt < 0:
            raise ValueError(f"SelectiveBackprop: interrupt must be an integer >= 0, got "
                             f"{interrupt!r}.")
        if scale_factor <= 0:
            raise ValueError(f"SelectiveBackprop: scale_factor must be > 0, got {scale_factor}.")
        self.start, self.end, self.keep = float(start), float(end), float(keep)
        self.scale_factor = float(scale_factor)
        self.interrupt = int(interrupt)
        self.target_key, self.input_key = target_key, input_key
        self._loss_fn: Optional[Callable[..., torch.Tensor]] = None

    def match(self, event: Event, state: State) -> bool:
        if event == Event.INIT:
            return True
        if event != Event.AFTER_DATALOADER or self.keep >= 1:
            return False
        elapsed = state.get_elapsed_duration()
        assert elapsed is not None, "max_duration is set before training"
        return should_selective_backprop(float(elapsed), int(state.timestamp.batch_in_epoch),
                                         self.start, self.end, self.interrupt)

    def _get(self, batch: Any, key: Any, name: str) -> torch.Tensor:
        try:
            value = batch_get(batch, key)
        except (KeyError, IndexError, AttributeError, TypeError):
            keys = sorted(map(str, batch)) if isinstance(batch, Mapping) else type(batch).__name__
            raise ValueError(f"SelectiveBackprop: the batch has no {name}={key!r} (batch: {keys})."
                             f" For a language model's dict batch pass input_key='input_ids', "
                             f"target_key='labels'.") from None
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"SelectiveBackprop: {name}={key!r} must name a tensor, got "
                            f"{type(value).__name__}.")
        return value

    def apply(self, event: Event, state: State, logger: Any) -> None:
        module = unwrap_model(state.model)  # a ComposerClassifier's own .module is no wrapper
        if event == Event.INIT:
            self._loss_fn = module.loss
            return
        batch = state.batch
        inputs = self._get(batch, self.input_key, "input_key")
        targets = self._get(batch, self.target_key, "target_key")
        n = inputs.shape[0]

        def forward(x: torch.Tensor) -> Any:
            return state.model(batch_set(_shallow_copy(batch), self.input_key, x))

        loss_fn = self._loss_fn or module.loss
        if _takes_reduction(loss_fn):
            def loss(outputs: Any, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
                return loss_fn(outputs, batch_set(_shallow_copy(batch), self.target_key, target),
                               reduction=reduction)
        else:
            def loss(outputs: Any, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
                return _token_losses(module, outputs, target)

        with get_precision_context(Precision(state.precision), device=state.device):
            idx = _score_and_select(inputs, targets, forward, loss, self.keep, self.scale_factor)
        state.batch = _index_samples(batch, idx, n)
        if logger is not None:
            logger.log_metrics({"selective_backprop/kept_samples": int(idx.shape[0])})


def _shallow_copy(batch: Any) -> Any:
    if isinstance(batch, Mapping):
        return dict(batch)
    if isinstance(batch, list):
        return list(batch)
    return batch  # tuples are rebuilt by batch_set


def _index_samples(batch: Any, idx: torch.Tensor, n: int) -> Any:
    """``batch`` with every tensor whose first dimension is ``n`` indexed by ``idx``."""
    if isinstance(batch, torch.Tensor):
        return batch[idx] if batch.ndim and batch.shape[0] == n else batch
    if isinstance(batch, Mapping):
        return {k: _index_samples(v, idx, n) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_index_samples(v, idx, n) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_index_samples(v, idx, n) for v in batch)
    return batch
