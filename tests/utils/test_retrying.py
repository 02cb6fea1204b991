"""Composer's ``retry`` and ``MissingConditionalImportError`` / ``import_object``."""

from __future__ import annotations

import functools

import pytest

from cadence.utils import MissingConditionalImportError, import_object, retry


def test_retry_until_success_passing_the_attempt_index() -> None:
    calls = []

    @retry(RuntimeError, num_attempts=3, initial_backoff=0, max_jitter=0)
    def flaky(x: int, retry_index: int = -1) -> int:
        calls.append(retry_index)
        if retry_index < 2:
            raise RuntimeError("too soon")
        return x * 2

    assert flaky(21) == 42 and calls == [0, 1, 2]


def test_retry_raises_the_last_error_and_ignores_other_exceptions() -> None:
    calls = []

    @retry((KeyError, OSError), num_attempts=2, initial_backoff=0, max_jitter=0)
    def always() -> None:
        calls.append(1)
        raise OSError("down")

    with pytest.raises(OSError, match="down"):
        always()
    assert len(calls) == 2

    @retry(KeyError, num_attempts=5, initial_backoff=0, max_jitter=0)
    def wrong() -> None:
        calls.append(2)
        raise ValueError("not retried")

    with pytest.raises(ValueError):
        wrong()
    assert calls.count(2) == 1


def test_retry_without_parentheses_and_bad_attempts() -> None:
    @retry
    def ok() -> str:
        return "fine"

    assert ok() == "fine" and ok.__name__ == "ok"
    with pytest.raises(ValueError, match="num_attempts"):
        retry(num_attempts=0)


def test_import_helpers() -> None:
    assert import_object("functools:partial") is functools.partial
    with pytest.raises(ValueError, match="module:attribute"):
        import_object("functools.partial")
    err = MissingConditionalImportError("s3", "s3fs", conda_channel=None)
    assert isinstance(err, ImportError) and "cadence[s3]" in str(err) and "pip install s3fs" in str(err)
