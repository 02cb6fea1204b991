"""Value checks of component arguments, run when a config is loaded, before anything is built.

:mod:`cadence.config.schema` checks each component section's argument *names* and
*types* against the component's signature (from the registry index, without importing it);
:mod:`cadence.config.values` then checks the *values* with this module, in two ways:

1. **Declared checks.** A component declares, per argument, what a good value is, next to
   the component: with the :func:`arg_checks` decorator, with :func:`declare_arg_checks` for
   a class cadence does not own (torch's optimizers, see :mod:`cadence.optim.optimizers`), or
   as ``typing.Annotated`` metadata in the constructor's signature
   (``window: Annotated[int, at_least(1)] = 20``). Each problem names the argument.
2. **Probes.** Optimizers, schedules, algorithms and callbacks are cheap to construct and
   have no side effects (as in Composer), so their own constructor is their check: each is
   constructed once here (an optimizer over one dummy parameter) and a ``ValueError`` /
   ``TypeError`` it raises becomes a config problem. Models, datasets and loggers are never
   probed (they are expensive or open files and runs); they rely on declared checks.

Example::

    @arg_checks(path=existing_text_path)
    def text_dataloader(..., path: PathLike, ...) -> DataLoader: ...

Source: torchtune's ``torchtune/config/_validate.py`` (check every component against its
signature before instantiating anything).
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar

__all__ = [
    "Check", "at_least", "greater_than", "in_interval", "each", "arg_checks",
    "declare_arg_checks", "declared_checks", "check_arg_values", "probe", "PROBED_KINDS",
    "Relation", "arg_relation",
]

T = TypeVar("T")

#: Registry kinds whose components are constructed once during validation (see module doc).
PROBED_KINDS = ("optimizer", "scheduler", "algorithm", "callback")


@dataclass(frozen=True)
class Check:
    """What a good value of one argument is.

    Attributes:
        test: returns whether ``value`` is good; it may raise ``ValueError`` with its own
            message (used as is), a ``TypeError`` counts as a bad value.
        expect: a good value, in words, for the message (``"a number >= 0"``).
    """

    test: Callable[[Any], bool]
    expect: str

    def problem(self, value: Any) -> Optional[str]:
        """``None`` when ``value`` passes, else what is wrong and what to use instead."""
        try:
            ok = bool(self.test(value))
        except ValueError as exc:
            return str(exc)
        except TypeError:
            ok = False
        return None if ok else f"{value!r} is out of range; use {self.expect}."


def at_least(bound: float) -> Check:
    """A number ``>= bound``."""
    return Check(lambda v: v >= bound, f"a number >= {bound:g}")


def greater_than(bound: float) -> Check:
    """A number ``> bound``."""
    return Check(lambda v: v > bound, f"a number > {bound:g}")


def in_interval(low: float, high: float) -> Check:
    """A number in ``[low, high)``."""
    return Check(lambda v: low <= v < high, f"a number in [{low:g}, {high:g})")


def each(check: Check) -> Check:
    """A list whose every item passes ``check``."""
    return Check(lambda v: all(check.test(item) for item in v),
                 f"a list of values, each {check.expect}")


_DECLARED: dict[Any, dict[str, Check]] = {}


def declare_arg_checks(target: Any, **checks: Check) -> None:
    """Declare value checks for ``target``'s arguments (``lr=at_least(0)``); for classes and
    functions cadence does not own. Later declarations add to earlier ones."""
    _DECLARED.setdefault(target, {}).update(checks)


def arg_checks(**checks: Check) -> Callable[[T], T]:
    """Decorator form of :func:`declare_arg_checks`; returns the component unchanged."""

    def decorate(target: T) -> T:
        declare_arg_checks(target, **checks)
        return target

    return decorate


def declared_checks(target: Any) -> dict[str, Check]:
    """Every check declared for ``target``: its base classes' first, then its own, then the
    ``Annotated`` metadata of its constructor's (or function's) parameters."""
    found: dict[str, Check] = {}
    chain = reversed(inspect.getmro(target)) if inspect.isclass(target) else [target]
    for owner in chain:
        found.update(_DECLARED.get(owner, {}))
    func = target.__init__ if inspect.isclass(target) else target  # type: ignore[misc]
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception:  # noqa: BLE001 - unresolvable annotations declare nothing
        hints = {}
    for name, hint in hints.items():
        if typing.get_origin(hint) is typing.Annotated:
            for meta in typing.get_args(hint)[1:]:
                if isinstance(meta, Check):
                    found[name] = meta
    return found


#: A check of several arguments together: given every argument's value (the defaults
#: filled in), ``None`` or ``(argument to blame, message)``.
Relation = Callable[[Mapping[str, Any]], Optional[tuple[str, str]]]

_RELATIONS: dict[Any, list[Relation]] = {}


def arg_relation(relation: Relation) -> Callable[[T], T]:
    """Decorator: declare a check across ``target``'s arguments (``n_head`` divides
    ``n_embd``), run after the per-argument checks passed; returns the target unchanged."""

    def decorate(target: T) -> T:
        _RELATIONS.setdefault(target, []).append(relation)
        return target

    return decorate


def _with_defaults(target: Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return dict(kwargs)
    values = {name: p.default for name, p in signature.parameters.items()
              if p.default is not inspect.Parameter.empty}
    values.update(kwargs)
    return values


def check_arg_values(target: Any, kwargs: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The declared checks of ``target`` that ``kwargs`` fails, as ``(argument, message)``:
    each argument's own checks, then (when those pass) the relations between arguments."""
    problems = []
    for name, check in declared_checks(target).items():
        if name in kwargs and kwargs[name] is not None:
            message = check.problem(kwargs[name])
            if message is not None:
                problems.append((name, message))
    if problems:
        return problems
    values = _with_defaults(target, kwargs)
    for relation in _RELATIONS.get(target, ()):
        try:
            found = relation(values)
        except (TypeError, ValueError, ZeroDivisionError):
            continue  # values of the wrong type are the type check's to report
        if found is not None:
            problems.append(found)
    return problems


def probe(kind: str, target: Callable[..., Any], kwargs: Mapping[str, Any],
          positional: Sequence[Any] = ()) -> Optional[str]:
    """Construct ``target(*positional, **kwargs)`` once, for a kind in :data:`PROBED_KINDS`,
    and return what its constructor rejected (``None`` when it accepted, or for other kinds).
    An optimizer gets one dummy parameter as its ``params``."""
    if kind not in PROBED_KINDS:
        return None
    if kind == "optimizer" and not positional:
        import torch

        positional = ([torch.nn.Parameter(torch.zeros(1))],)
    try:
        target(*positional, **kwargs)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        return f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc)
    return None
