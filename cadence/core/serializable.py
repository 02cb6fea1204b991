"""``Serializable``: an object whose state a checkpoint carries (Composer's
``composer.core.serializable``)."""

from __future__ import annotations

from typing import Any

__all__ = ["Serializable"]


class Serializable:
    """Something with state to save: :meth:`state_dict` returns it (tensors and plain Python
    values, so a checkpoint loads with ``torch.load(weights_only=True)``) and
    :meth:`load_state_dict` puts it back. :class:`~cadence.Algorithm` and
    :class:`~cadence.Callback` are Serializable; by default they have no state.
    """

    def state_dict(self) -> dict[str, Any]:
        """This object's state (default: none)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (default: nothing to restore)."""
        del state
