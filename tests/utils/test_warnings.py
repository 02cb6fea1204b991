"""Composer's ``composer.utils.warnings.VersionedDeprecationWarning`` (issue 34, item 4):
Composer's pytest configuration names it in ``filterwarnings``, so its test suite cannot start
on cadence without it."""

from __future__ import annotations

import warnings

import pytest

from cadence.utils.warnings import VersionedDeprecationWarning


def test_the_message_names_the_removal_version_and_filters_match_it() -> None:
    with pytest.warns(VersionedDeprecationWarning,
                      match=r"^Use g\. It will be removed in version 0\.20\.0\.$") as record:
        warnings.warn(VersionedDeprecationWarning("Use g.", remove_version="0.20.0"))
    assert record[0].message.remove_version == "0.20.0"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        warnings.filterwarnings("ignore", category=VersionedDeprecationWarning)  # wins
        warnings.warn(VersionedDeprecationWarning("Use g.", remove_version="1.0"))
    assert issubclass(VersionedDeprecationWarning, DeprecationWarning)
