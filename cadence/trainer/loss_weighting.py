"""How each microbatch's loss is weighted in one optimizer step.

A model's loss is a mean over its microbatch: over samples, or, for a language model, over
the tokens that carry a label (labels not equal to ``-100``; for a causal LM the shifted
labels ``labels[:, 1:]``). The step must be the gradient of the whole batch's mean, over
every microbatch on every data-parallel rank.

- Samples (default; ``accumulate_train_batch_on_tokens=False``): microbatch ``m``'s loss
  is weighted by ``samples_m / samples of the rank's batch``. Exact for a per-sample mean,
  biased for a per-token mean when sequences hold different numbers of loss tokens: a
  3-token sequence then weighs as much as a 16-token one.
- Tokens (``accumulate_train_batch_on_tokens=True``, Composer's name): the batch's loss
  tokens are counted once per batch, over its microbatches and the data-parallel ranks
  (one all-reduce of one number per batch), and microbatch ``m`` is weighted by
  ``tokens_m / tokens of the global batch``, times the data-parallel size (DDP and FSDP2
  average gradients over the ranks; the factor undoes that, as Hugging Face's Trainer does
  with ``average_tokens_across_devices``). Any split of a batch into microbatches and ranks
  then gives the whole-batch step.

Where the count comes from: the model's ``num_loss_tokens(batch)`` method (an int or a
0-dim tensor; :meth:`HuggingFaceModel.num_loss_tokens
<cadence.models.huggingface.HuggingFaceModel.num_loss_tokens>` counts the labels that are not
``-100``, shifted for a causal LM). It plays the part of Composer's
``DataSpec.get_num_tokens_in_batch(batch, token_type='loss_generating')``; cadence asks the
model, as it does for ``num_tokens``. A model without it is weighted by samples, with a
warning.

A model whose ``accepts_num_items_in_batch`` is true (a Hugging Face causal LM whose
``forward`` takes ``num_items_in_batch``) gets the global count in its microbatch, as the
key ``num_items_in_batch`` (a 0-dim int64 tensor), and returns ``sum of token losses /
num_items_in_batch`` (Hugging Face's ``num_items_in_batch``): its loss needs only the
data-parallel factor, and a microbatch without loss tokens gives 0, not ``nan`` (by samples
too, for a model with ``num_loss_tokens``). With tokens, a global batch without any loss
token is not a step (no optimizer or scheduler step, no loss logged; a warning counts them;
one host read of the count per batch), and a run whose first :data:`EMPTY_BATCHES_REFUSED`
batches all have none is refused.

The loss the Trainer keeps (``state.loss``, ``state.total_loss``) is the weighted one: one
rank's ``state.total_loss`` is its part of the batch's mean, times the data-parallel size,
so its mean over the ranks (the logged ``loss/train/total``) is the batch's mean loss per
token (per sample when weighting by samples).

Sources: Composer's ``accumulate_train_batch_on_tokens`` (``composer/trainer/trainer.py``,
``_train_microbatches``), Hugging Face ``Trainer`` ``num_items_in_batch``
(``transformers/trainer.py``, ``_get_num_items_in_batch``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Optional

import torch

from cadence.core.data_spec import num_samples
from cadence.utils import dist

__all__ = ["LossWeighting", "mean_over_ranks"]

log = logging.getLogger(__name__)


class LossWeighting:
    """The weight of each microbatch's loss in the step of one batch.

    The Trainer calls :meth:`begin_batch` once per batch (on every rank: with tokens it is a
    collective), then per microbatch :meth:`prepare` before the forward and :meth:`weigh`
    on its loss.

    Args:
        model: the unwrapped model (the ``ComposerModel``).
        on_tokens: ``accumulate_train_batch_on_tokens``.
        dp_size: data-parallel ranks (ranks with their own samples).
        dp_group: their process group; None: the world (no tensor parallelism).
    """

    def __init__(self, model: torch.nn.Module, on_tokens: bool, dp_size: int = 1,
                 dp_group: Optional[Any] = None) -> None:
        self._counter = getattr(model, "num_loss_tokens", None) if on_tokens else None
        if on_tokens and not callable(self._counter):
            log.warning(
                "accumulate_train_batch_on_tokens=True, but %s has no num_loss_tokens(batch) "
                "method: microbatches are weighted by samples. Define num_loss_tokens (the "
                "tokens whose label is not -100) to weight them by tokens.", type(model).__name__)
            self._counter = None
        self.on_tokens = self._counter is not None
        self._num_items = self.on_tokens and bool(getattr(model, "accepts_num_items_in_batch",
                                                          False))
        self._dp_size, self._dp_group = int(dp_size), dp_group
        self._batch_samples = 1
        self._batch_tokens: Optional[torch.Tensor] = None
        loss_counter = getattr(model, "num_loss_tokens", None)
        self._loss_counter = loss_counter if callable(loss_counter) else None
        #: whether the global batch of :meth:`begin_batch` has a loss token (tokens mode)
        self.has_loss_tokens = True
        self.skipped_batches = 0  # batches without a loss token, not stepped
        self._stepped_batches = 0

    def begin_batch(self, batch: Any, batch_size: int, device: torch.device) -> None:
        """Count ``batch`` (this rank's, ``batch_size`` samples) once: with tokens, its loss
        tokens summed over the data-parallel ranks (one all-reduce)."""
        self._batch_samples = batch_size
        if not self.on_tokens:
            return
        count = self._count(batch).to(device=device, dtype=torch.int64).reshape(())
        if self._dp_size > 1:
            import torch.distributed as torch_dist

            count = count.clone()
            torch_dist.all_reduce(count, group=self._dp_group)
        # no loss token in the whole batch: the Trainer skips its step (one host sync a batch)
        self.has_loss_tokens = bool(count.item() > 0)
        self._batch_tokens = count.clamp(min=1)

    def note_skipped(self) -> int:
        """Count a batch skipped for having no loss token; returns the count so far.

        Raises:
            ValueError: the first :data:`EMPTY_BATCHES_REFUSED` batches had none: the
                labels are all ``-100`` (a masking or data error), nothing would train.
        """
        self.skipped_batches += 1
        if self._stepped_batches == 0 and self.skipped_batches >= EMPTY_BATCHES_REFUSED:
            raise ValueError(
                f"The first {self.skipped_batches} batches have no loss token (every label is "
                f"-100), so nothing trains: check the data's labels and masking (an "
                f"instruction record's response, the collator's padding).")
        return self.skipped_batches

    def note_stepped(self) -> None:
        """Count a batch that was stepped."""
        self._stepped_batches += 1

    def prepare(self, microbatch: Any) -> Any:
        """The microbatch the model runs on: with ``num_items_in_batch``, a copy with that
        key (the global count) added; else ``microbatch`` itself."""
        if self._num_items and isinstance(microbatch, Mapping):
            return {**microbatch, "num_items_in_batch": self._batch_tokens}
        return microbatch

    def weigh(self, loss: torch.Tensor, microbatch: Any) -> torch.Tensor:
        """``loss`` (the model's, on ``microbatch``) weighted by its share of the batch.

        Shapes: ``loss`` a scalar; the result a scalar.
        """
        if not self.on_tokens:
            share = num_samples(microbatch) / self._batch_samples
            if self._loss_counter is not None:  # no loss token: its mean is nan (0 / 0)
                tokens = torch.as_tensor(self._loss_counter(microbatch)).to(loss.device)
                return torch.where(tokens > 0, loss * share, torch.zeros_like(loss))
            # a whole batch (share 1.0) needs no scaling: no extra multiply or autograd node
            return loss if share == 1.0 else loss * share
        if self._num_items:  # already sum / global tokens
            return loss if self._dp_size == 1 else loss * self._dp_size
        assert self._batch_tokens is not None, "begin_batch() was not called"
        tokens = self._count(microbatch).to(loss.device)
        weight = tokens * self._dp_size / self._batch_tokens
        # a microbatch without loss tokens: its mean is nan (0 / 0); it contributes nothing
        return torch.where(tokens > 0, loss * weight, torch.zeros_like(loss))

    def _count(self, batch: Any) -> torch.Tensor:
        assert self._counter is not None
        return torch.as_tensor(self._counter(batch))


#: A run whose first this many batches all lack a loss token is refused.
EMPTY_BATCHES_REFUSED = 10


def mean_over_ranks(loss: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``loss`` (a rank's ``state.total_loss``) averaged over every rank: the logged
    ``loss/train/total``, the batch's mean loss. A collective when there are several ranks
    (every rank logs at the same steps); ``loss`` itself on one rank."""
    if loss is None or dist.get_world_size() <= 1:
        return loss
    loss = loss.clone()
    dist.all_reduce(loss, "sum")
    return loss / dist.get_world_size()
