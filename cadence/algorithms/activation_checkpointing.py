"""Activation checkpointing as an algorithm: model surgery at ``INIT``.

The functions that do the work (:func:`apply_activation_checkpointing`,
:func:`select_blocks`, ...) live in :mod:`cadence.parallel.activation_checkpointing`,
the first step of the parallelize plan, and are re-exported here. The algorithm runs at
``INIT``, before the plan (compile, tensor parallelism, FSDP2); when it has checkpointed
blocks the plan's own step (the fsdp keys ``activation_checkpointing`` /
``activation_cpu_offload``) leaves them as the algorithm set them.

Source: Chen et al., "Training Deep Nets with Sublinear Memory Cost", 2016;
``torch.utils.checkpoint.checkpoint(use_reentrant=False)``; torchtitan's ``apply_ac``
(``ac_freq``: checkpoint every n-th block).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Optional

from torch import nn

from cadence.core import Algorithm, Event, State
from cadence.utils.misc import unwrap_model
from cadence.parallel.activation_checkpointing import (
    apply_activation_checkpointing, is_checkpointed, remove_activation_checkpointing,
    select_blocks,
)
from cadence.registry import algorithms

__all__ = [
    "ActivationCheckpointing", "apply_activation_checkpointing", "remove_activation_checkpointing",
    "select_blocks", "is_checkpointed",
]

log = logging.getLogger(__name__)


@algorithms.register("activation_checkpointing")
class ActivationCheckpointing(Algorithm):
    """Recompute transformer blocks in backward instead of keeping their activations.

    Applied once at ``INIT`` (before DDP/FSDP2 wrap the model). The defaults checkpoint every
    transformer block the model names (``activation_checkpointing_fn``; for a
    ``HuggingFaceModel`` its ``_no_split_modules``), which is what the fsdp key
    ``activation_checkpointing: true`` means in Composer. A model with no such blocks (a
    plain MLP) is left as it is, with a warning in the log.

    Args:
        layer_cls: class names of the blocks to checkpoint (e.g. ``["GPT2Block"]``); default
            the model's own choice.
        every_n: checkpoint every n-th block (selective layer checkpointing: ``2`` halves
            the recomputation and keeps half the activations); ``0``: none (offload only).
        offload_to_cpu: keep the saved activations of the selected blocks that are not
            checkpointed on the CPU (``every_n: 0, offload_to_cpu: true`` offloads all).

    Example (YAML)::

        algorithms:
          activation_checkpointing: {every_n: 1}

    Raises:
        ValueError: ``every_n`` < 0; at ``INIT``, ``layer_cls`` names a class the model lacks.
    """

    events = frozenset({Event.INIT})

    def __init__(self, layer_cls: Optional[list[str]] = None, every_n: int = 1,
                 offload_to_cpu: bool = False) -> None:
        if isinstance(every_n, bool) or not isinstance(every_n, int) or every_n < 0:
            raise ValueError(f"every_n must be an int >= 0 (0: checkpoint none), got {every_n!r}.")
        if isinstance(layer_cls, str):
            layer_cls = [layer_cls]
        self.layer_cls = list(layer_cls) if layer_cls else None
        self.every_n = every_n
        self.offload_to_cpu = bool(offload_to_cpu)
        self.applied: dict[str, list[str]] = {"checkpointed": [], "offloaded": []}

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Any) -> None:
        model = unwrap_model(state.model)
        self.applied = apply_activation_checkpointing(
            model, layer_cls=self.layer_cls, every_n=self.every_n,
            offload_to_cpu=self.offload_to_cpu)
        checkpointed, offloaded = self.applied["checkpointed"], self.applied["offloaded"]
        if not checkpointed and not offloaded:
            log.warning(
                "ActivationCheckpointing: no blocks selected in %s, nothing is checkpointed. "
                "Give layer_cls (class names) or define activation_checkpointing_fn(module) "
                "on the model.", type(model).__name__)
            return
        if self.offload_to_cpu and not offloaded:
            log.warning("ActivationCheckpointing: offload_to_cpu has no effect: every selected "
                        "block is recomputed (every_n=1), so no activations are left to offload. "
                        "Use every_n=0 to offload instead of recomputing, or every_n=2 for both.")
        log.info("ActivationCheckpointing: checkpointed %d blocks%s%s", len(checkpointed),
                 f" ({_summary(model, checkpointed)})" if checkpointed else "",
                 f", offloaded {len(offloaded)} to CPU" if offloaded else "")


def _summary(model: nn.Module, names: Iterable[str]) -> str:
    modules = dict(model.named_modules())
    kinds = sorted({type(modules[n]).__name__ for n in names})
    return ", ".join(kinds)
