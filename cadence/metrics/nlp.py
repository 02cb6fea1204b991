"""Language-model metrics: cross entropy, perplexity and masked accuracy.

Shapes: ``batch`` = sequences, ``seq`` = positions, ``vocab`` = vocabulary size.

Source: MosaicML Composer's ``LanguageCrossEntropy`` and ``LanguagePerplexity``
(``composer/metrics/nlp.py``). As there, callers pass logits and targets that are already
aligned (for a causal LM: ``logits[:, :-1]`` against ``labels[:, 1:]``, which
:meth:`cadence.models.HuggingFaceModel.update_metric` does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics import Metric

__all__ = ["BinaryF1Score", "LanguageCrossEntropy", "LanguagePerplexity", "MaskedAccuracy"]


class LanguageCrossEntropy(Metric):
    """Mean cross entropy per non-ignored token, in nats/token.

    Accumulates two states, both summed across ranks (``dist_reduce_fx="sum"``), so the
    result is the exact token-weighted mean over every batch on every rank:

    - ``sum_loss``: summed cross entropy (nats) of the counted tokens, float32 scalar.
    - ``total_items``: number of target tokens not equal to ``ignore_index``, int64 scalar.

    Args:
        ignore_index: target value whose positions are left out (padding, prompt tokens).
            Default ``-100``, the value ``transformers`` models use for their own loss.
        dist_sync_on_step: synchronise states across ranks on every ``forward`` call
            (torchmetrics option). Default ``False``.

    Source: Composer ``composer/metrics/nlp.py`` (``LanguageCrossEntropy``).

    Example::

        metric = LanguageCrossEntropy()
        metric.update(logits[:, :-1], labels[:, 1:])   # [batch, seq-1, vocab], [batch, seq-1]
        metric.compute()                               # tensor(nats per token)
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = False

    sum_loss: torch.Tensor
    total_items: torch.Tensor

    def __init__(self, dist_sync_on_step: bool = False, ignore_index: int = -100) -> None:
        super().__init__(dist_sync_on_step=dist_sync_on_step)
        self.ignore_index = ignore_index
        self.add_state("sum_loss", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("total_items", default=torch.tensor(0, dtype=torch.long),
                       dist_reduce_fx="sum")

    def update(self, output: Any, target: torch.Tensor) -> None:  # type: ignore[override]
        """Add one batch.

        Args:
            output: logits ``[batch, seq, vocab]`` (any leading shape ``[..., vocab]``
                works), or a mapping/``ModelOutput`` holding them under ``"logits"``.
            target: token ids ``[batch, seq]`` (the logits' leading shape), with
                ``ignore_index`` where a position must not count.

        Raises:
            TypeError: ``output`` is neither a tensor nor a mapping with ``"logits"``.
            ValueError: the shapes of ``output`` and ``target`` do not line up.
        """
        if isinstance(output, Mapping):
            if "logits" not in output:
                raise TypeError(
                    f"{type(self).__name__}.update got a mapping without 'logits' "
                    f"(keys: {sorted(output)}); pass logits [batch, seq, vocab]."
                )
            logits = output["logits"]
        elif isinstance(output, torch.Tensor):
            logits = output
        else:
            raise TypeError(
                f"{type(self).__name__}.update expects logits [batch, seq, vocab] as a tensor, "
                f"got {type(output).__name__}."
            )
        if logits.dim() < 2 or tuple(logits.shape[:-1]) != tuple(target.shape):
            raise ValueError(
                f"{type(self).__name__}.update: logits {tuple(logits.shape)} must be "
                f"[batch, seq, vocab] and target {tuple(target.shape)} [batch, seq] with the "
                "same leading shape. For a causal LM pass logits[:, :-1] and labels[:, 1:]."
            )
        flat_target = target.reshape(-1)                        # [batch*seq]
        flat_logits = logits.reshape(flat_target.numel(), -1)   # [batch*seq, vocab]
        # Upcast so bf16/fp16 logits do not lose precision in the log-softmax.
        losses = F.cross_entropy(flat_logits.float(), flat_target,
                                 ignore_index=self.ignore_index, reduction="sum")
        self.sum_loss += losses.to(self.sum_loss.dtype)
        self.total_items += (flat_target != self.ignore_index).sum().to(self.total_items.device)

    def compute(self) -> torch.Tensor:
        """Mean cross entropy in nats per counted token (``nan`` if no token was counted)."""
        return self.sum_loss / self.total_items


class LanguagePerplexity(LanguageCrossEntropy):
    """Perplexity: ``exp`` of the mean cross entropy per non-ignored token.

    A model that puts equal logits on every token scores exactly ``vocab``. Same arguments
    and states as :class:`LanguageCrossEntropy`; the exponential is taken after the
    token-weighted (and cross-rank) mean, not per batch.

    Source: Composer ``composer/metrics/nlp.py`` (``LanguagePerplexity``).
    """

    def compute(self) -> torch.Tensor:
        """``exp(mean cross entropy)``, dimensionless."""
        return torch.exp(super().compute())


class MaskedAccuracy(Metric):
    """Accuracy of the argmax prediction over the targets that are not ``ignore_index``
    (masked-language-model tokens, padded sequences).

    States (summed across ranks): ``correct`` and ``total``, int64 scalars.

    Args:
        ignore_index: target value left out; default ``-100``.
        dist_sync_on_step: torchmetrics option; default ``False``.

    Source: Composer ``composer/metrics/nlp.py`` (``MaskedAccuracy``), same arguments.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    correct: torch.Tensor
    total: torch.Tensor

    def __init__(self, ignore_index: int = -100, dist_sync_on_step: bool = False) -> None:
        super().__init__(dist_sync_on_step=dist_sync_on_step)
        self.ignore_index = ignore_index
        self.add_state("correct", default=torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:  # type: ignore[override]
        """Add one batch: ``preds`` are scores ``[..., classes]``, ``target`` class ids
        ``[...]`` (the scores' leading shape)."""
        predicted = preds.argmax(dim=-1)               # [...]
        mask = target != self.ignore_index
        self.correct += (predicted[mask] == target[mask]).sum()
        self.total += mask.sum()

    def compute(self) -> torch.Tensor:
        """``correct / total`` as a float in ``[0, 1]`` (``nan`` before any target)."""
        return self.correct.float() / self.total


class BinaryF1Score(Metric):
    """F1 score of a two-class classifier: ``2 TP / (2 TP + FP + FN)``, class 1 positive.

    ``update(output, target)``: ``output`` ``[N, 2]`` scores (argmax over dim 1), ``target``
    ``[N]`` in ``{0, 1}``. States (summed across ranks): ``true_positive``,
    ``false_positive``, ``false_negative``.

    Args:
        dist_sync_on_step: torchmetrics option; default ``False``.

    Raises:
        ValueError: (``compute``) nothing was counted (no positives predicted or present).

    Source: Composer's ``BinaryF1Score`` (``composer/metrics/nlp.py``).
    """

    full_state_update = False

    def __init__(self, dist_sync_on_step: bool = False) -> None:
        super().__init__(dist_sync_on_step=dist_sync_on_step)
        for name in ("true_positive", "false_positive", "false_negative"):
            self.add_state(name, default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, output: torch.Tensor, target: torch.Tensor) -> None:
        predicted = output.argmax(dim=1).bool()
        positive = target.bool()
        self.true_positive += (predicted & positive).sum()
        self.false_positive += (predicted & ~positive).sum()
        self.false_negative += (~predicted & positive).sum()

    def compute(self) -> torch.Tensor:
        denominator = 2 * self.true_positive + self.false_positive + self.false_negative
        if int(denominator) == 0:
            raise ValueError("BinaryF1Score: no positive sample was predicted or seen; F1 is "
                             "undefined.")
        return 2 * self.true_positive / denominator
