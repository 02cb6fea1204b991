"""Composer's ``composer.algorithms.seq_length_warmup``: the names of :mod:`cadence.algorithms.seq_length_warmup.seq_length_warmup`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "SeqLengthWarmup": "cadence.algorithms.seq_length_warmup.seq_length_warmup",
    "set_batch_sequence_length": "cadence.algorithms.seq_length_warmup.seq_length_warmup",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
