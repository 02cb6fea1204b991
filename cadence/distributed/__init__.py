"""Composer's ``composer.distributed``:
:func:`~cadence.distributed.dist_strategy.prepare_fsdp_module`, sharding a model outside the
Trainer (cadence's Trainer shards through
:mod:`cadence.parallel.plan`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.distributed.dist_strategy import prepare_fsdp_module

_LAZY = {"prepare_fsdp_module": "cadence.distributed.dist_strategy"}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
