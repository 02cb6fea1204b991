"""What a problem in a run config is, and how its message reads.

:class:`ConfigError` lists every :class:`ConfigProblem` found in a run file, one per line,
each naming the full key path, the bad value and the fix. The helpers here word the parts
every check shares: a value with its type (:func:`show`), a "did you mean"
(:func:`did_you_mean`) and a choice among allowed values (:func:`choice_message`).

The same errors come from the run file and from a config section built in Python (the
typed sections of :mod:`cadence.parallel.config` and :mod:`cadence.parallel.compile_config`
raise them from ``__post_init__``), so both read alike. This module imports only the standard
library: the run-file check's first stage (:mod:`cadence.config.schema`) raises these errors
before torch is imported.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

__all__ = ["ConfigProblem", "ConfigError", "show", "first_line", "did_you_mean",
           "choice_message", "qualname"]


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in a run config.

    Attributes:
        key: the full dotted key path (``"model.n_layers"``; ``"<root>"`` for the whole file).
        message: what is wrong and how to fix it.
    """

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


class ConfigError(ValueError):
    """A run config has problems; the message lists all of them, one per line.

    Attributes:
        problems: every problem found, in file order.
        source: where the config came from (a path, ``"<dict>"``), or ``None``.
    """

    def __init__(self, problems: Sequence[ConfigProblem], source: Optional[str] = None) -> None:
        self.problems = list(problems)
        self.source = source
        count = len(self.problems)
        where = f" {source}" if source else ""
        header = f"{count} problem{'s' if count != 1 else ''} in run config{where}:"
        super().__init__("\n".join([header, *(f"  - {p}" for p in self.problems)]))


def show(value: Any) -> str:
    """A value as it would read in YAML-ish form, with its type: ``'abc' (str)``, ``null``."""
    if value is None:
        return "null"
    return f"{value!r} ({type(value).__name__})"


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def did_you_mean(word: str, options: Iterable[str], ignore_case: bool = False) -> str:
    """``" Did you mean 'x'?"`` for the closest of ``options`` (difflib ratio >= 0.6), else
    ``""``. cadence's one "did you mean": every check words its hint here.

    Args:
        word: what was written.
        options: the allowed spellings.
        ignore_case: compare without case (for values accepted in any case, such as
            ``sharding_strategy``); the hint still shows the option as spelled in
            ``options``.
    """
    options = list(options)
    if not ignore_case:
        close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
        return f" Did you mean {close[0]!r}?" if close else ""
    by_folded: dict[str, str] = {}
    for option in options:
        by_folded.setdefault(option.casefold(), option)
    close = difflib.get_close_matches(word.casefold(), list(by_folded), n=1, cutoff=0.6)
    return f" Did you mean {by_folded[close[0]]!r}?" if close else ""


def choice_message(value: Any, allowed: Sequence[str], prefix: bool = True) -> str:
    """``"'bf16' (str) is not one of: fp32, amp_bf16. Did you mean 'amp_bf16'?"``; without
    ``prefix`` the message starts at ``"is not one of"``."""
    hint = did_you_mean(str(value), allowed) if isinstance(value, str) else ""
    head = f"{show(value)} is" if prefix else "is"
    return f"{head} not one of: {', '.join(allowed)}.{hint}"


def qualname(obj: Any) -> str:
    """``module.QualName`` of a class or function, as messages name a component."""
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    return f"{module}.{name}" if module else name
