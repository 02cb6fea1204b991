"""Composer's ``composer.algorithms.channels_last``: the names of :mod:`cadence.algorithms.channels_last.channels_last`, read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "ChannelsLast": "cadence.algorithms.channels_last.channels_last",
    "apply_channels_last": "cadence.algorithms.channels_last.channels_last",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
