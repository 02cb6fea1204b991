"""The model wrapper the Trainer drives: :class:`ComposerModel`.

Source: MosaicML Composer's ``ComposerModel`` (``composer/models/base.py``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import nn

__all__ = ["ComposerModel"]


class ComposerModel(nn.Module):
    """Base class for models trained by :class:`~cadence.Trainer`.

    Subclasses implement :meth:`forward` and :meth:`loss`; they override
    :meth:`eval_forward`, :meth:`get_metrics` and :meth:`update_metric` to get eval metrics.

    Optional hooks read by parallelism and algorithms (define them to opt in):

    - ``fsdp_wrap_fn(module) -> bool | dict``: which submodules become FSDP units.
    - ``activation_checkpointing_fn(module) -> bool``: which submodules to checkpoint.
    - ``init_weights()`` (torchtitan's) or ``param_init_fn(module)`` (Composer's, called
      per module, children first): initialise a model built on the meta device, after the
      parallelize plan has sharded it and allocated each rank's shards (``to_empty``);
      ``init_weights`` wins when both exist. The hook writes into the (possibly sharded)
      parameters in place; the contract is
      :func:`cadence.parallel.param_init.materialize_and_init`'s.
    - ``tp_plan() -> dict[str, str | ParallelStyle]``: the model's tensor-parallel plan,
      ``{module-name pattern: style}`` (``colwise``, ``rowwise``, ``sequence_parallel``,
      ``fused_qkv_colwise``, ``replicate``, or a ``ParallelStyle``), used when
      ``parallelism_config.tp`` has no ``layer_plan``; without it the built-in plans for
      GPT-2 and Llama blocks apply (:mod:`cadence.parallel.tp`).
    - a submodule attribute ``_fsdp_wrap = True``: make that submodule an FSDP unit.
    - ``num_loss_tokens(batch) -> int | Tensor``: the tokens of ``batch`` that carry a loss
      (labels not ``-100``), read with ``accumulate_train_batch_on_tokens`` to weight
      microbatches by tokens (Composer's ``get_num_tokens_in_batch(token_type=
      'loss_generating')``); without it microbatches are weighted by samples. With
      ``accepts_num_items_in_batch = True`` the Trainer also adds the global batch's count
      to each microbatch as ``num_items_in_batch`` and the loss must be the sum over the
      microbatch's tokens divided by it (Hugging Face's convention); see
      :mod:`cadence.trainer.loss_weighting`.

    Example::

        class Classifier(ComposerModel):
            def __init__(self):
                super().__init__()
                self.net = nn.Linear(16, 3)

            def forward(self, batch):              # batch: (x [batch, 16], y [batch])
                return self.net(batch[0])          # logits [batch, 3]

            def loss(self, outputs, batch):
                return F.cross_entropy(outputs, batch[1])
    """

    #: The run's :class:`~cadence.Logger`, set by the Trainer (Composer's
    #: ``ComposerModel.logger``), so a model can log from ``forward`` or ``loss``
    #: (``self.logger.log_metrics({...})`` when it is not None). ``None`` outside a Trainer.
    logger: Optional[Any] = None

    @abstractmethod
    def forward(self, batch: Any) -> Any:
        """Compute the outputs for ``batch`` (whatever the dataloader yields)."""

    @abstractmethod
    def loss(self, outputs: Any, batch: Any) -> torch.Tensor:
        """The scalar training loss for ``outputs`` of :meth:`forward` on ``batch``; mean over
        the batch's samples (or tokens), so microbatch losses can be averaged."""

    def eval_forward(self, batch: Any, outputs: Optional[Any] = None) -> Any:
        """Outputs used to update eval metrics; default: ``outputs`` if given, else ``forward``."""
        return outputs if outputs is not None else self(batch)

    def get_metrics(self, is_train: bool = False) -> dict[str, Any]:
        """``{name: torchmetrics.Metric}`` for training (``is_train``) or eval. Default: none.

        Return fresh metric objects on each call: the Trainer owns and moves them.
        """
        del is_train
        return {}

    def update_metric(self, batch: Any, outputs: Any, metric: Any) -> None:
        """Update ``metric`` with one batch. Default: ``metric.update(outputs, batch[-1])``
        for tuple batches, else ``metric.update(outputs, batch['labels'])``."""
        target = batch["labels"] if isinstance(batch, Mapping) else batch[-1]
        metric.update(outputs, target)

    def num_tokens(self, batch: Any) -> int:
        """Tokens in ``batch`` (for ``tok`` time units and throughput). Default: the element
        count of ``input_ids`` when the batch is a mapping (a dict, a ``BatchEncoding``) that has it, else 0."""
        if isinstance(batch, Mapping) and "input_ids" in batch:
            return int(batch["input_ids"].numel())
        return 0
