"""Composer's ``composer.utils.retrying``: :func:`retry`, a decorator that calls a function
again, with exponential backoff and jitter, when it raises one of the given exceptions.

Source: Composer 0.32.1 ``composer/utils/retrying.py`` (signature, the backoff
``initial_backoff * 2**i + random() * max_jitter`` before retry ``i + 1``, the optional
``retry_index`` argument, use with or without parentheses).
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import logging
import random
import time
from typing import Any, Callable, Sequence, TypeVar, Union

__all__ = ["retry"]

log = logging.getLogger(__name__)

TCallable = TypeVar("TCallable", bound=Callable[..., Any])


def retry(exc_class: Union[TCallable, type[Exception], Sequence[type[Exception]]] = Exception,
          num_attempts: int = 3, initial_backoff: float = 1.0,
          max_jitter: float = 0.5) -> Any:
    """Retry the decorated function when it raises ``exc_class``.

    ``@retry`` (no parentheses) retries on any :class:`Exception` with the defaults. After
    failed attempt ``i`` (0-based) it sleeps ``initial_backoff * 2**i + U(0, max_jitter)``
    seconds; the last failure is raised as it is. A decorated function that takes a
    ``retry_index`` parameter receives the attempt number (0, 1, ...).

    Args:
        exc_class: the exception class or classes to retry on. Default :class:`Exception`.
        num_attempts: attempts in all (default 3; at least 1).
        initial_backoff: seconds before the first retry (default 1.0).
        max_jitter: the most random seconds added to each wait (default 0.5).

    Raises:
        ValueError: ``num_attempts`` below 1.
    """
    if num_attempts < 1:
        raise ValueError(f"retry num_attempts must be at least 1, got {num_attempts!r}.")

    def decorate(func: TCallable) -> TCallable:
        takes_index = "retry_index" in inspect.signature(func).parameters
        catch = tuple(exc_class) if isinstance(exc_class, collections.abc.Sequence) \
            else exc_class

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            for attempt in range(num_attempts):
                if takes_index:
                    kwargs["retry_index"] = attempt
                try:
                    return func(*args, **kwargs)
                except catch as exc:  # type: ignore[misc]
                    if attempt + 1 == num_attempts:
                        raise
                    log.debug("Attempt %d of %s failed (%s: %s); retrying.", attempt,
                              getattr(func, "__name__", func), type(exc).__name__, exc)
                    time.sleep(initial_backoff * 2 ** attempt + random.random() * max_jitter)
            raise AssertionError("unreachable")  # num_attempts >= 1

        return call  # type: ignore[return-value]

    if not isinstance(exc_class, collections.abc.Sequence) and not (
            isinstance(exc_class, type) and issubclass(exc_class, BaseException)):
        func, exc_class = exc_class, Exception  # used as @retry, without parentheses
        return decorate(func)  # type: ignore[arg-type]
    return decorate
