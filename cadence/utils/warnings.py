"""Composer's ``composer.utils.warnings``: the deprecation warning that names its removal."""

from __future__ import annotations

__all__ = ["VersionedDeprecationWarning"]


class VersionedDeprecationWarning(DeprecationWarning):
    """A :class:`DeprecationWarning` whose message says in which version the feature goes.

    Args:
        message: why the feature is deprecated (and what to use instead).
        remove_version: the version that removes it, e.g. ``"0.20.0"``; the warning's text is
            ``f"{message} It will be removed in version {remove_version}."``.
    """

    def __init__(self, message: str, remove_version: str) -> None:
        super().__init__(f"{message} It will be removed in version {remove_version}.")
        self.remove_version = remove_version
