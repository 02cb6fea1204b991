"""Training time: :class:`Time` (a value and a unit) and :class:`Timestamp` (where a run is).

Units follow Composer's: ``ep`` (epochs), ``ba`` (batches, i.e. optimizer steps), ``sp``
(samples), ``tok`` (tokens) and ``dur`` (a fraction of ``max_duration``). A duration is
written as a string such as ``"2ep"``, ``"100ba"``, ``"4096sp"``, ``"1e6tok"`` or
``"0.5dur"`` and compared directly with a :class:`Timestamp`::

    if state.timestamp >= "100ba": ...

Source: the ``Time``/``Timestamp`` API of MosaicML Composer (``composer/core/time.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any, Union

__all__ = ["Time", "TimeUnit", "Timestamp", "TimeLike"]


class TimeUnit(str, Enum):
    """The unit of a :class:`Time`. The value is the suffix used in strings."""

    EPOCH = "ep"
    BATCH = "ba"
    SAMPLE = "sp"
    TOKEN = "tok"
    DURATION = "dur"


_UNIT_NAMES = ", ".join(f"'{u.value}'" for u in TimeUnit)
_TIME_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z]+)\s*$")


@dataclass(frozen=True, order=False)
class Time:
    """An amount of training time: ``value`` in ``unit``.

    Args:
        value: the amount; an ``int`` for ``ep``/``ba``/``sp``/``tok``, a ``float`` in
            ``[0, 1]``-ish for ``dur`` (values above 1 are allowed but rarely meant).
        unit: a :class:`TimeUnit` or its string suffix.

    Raises:
        ValueError: ``value`` is negative, or a non-``dur`` value is not a whole number.
    """

    value: Union[int, float]
    unit: TimeUnit

    def __post_init__(self) -> None:
        unit = TimeUnit(self.unit) if not isinstance(self.unit, TimeUnit) else self.unit
        object.__setattr__(self, "unit", unit)
        if self.value < 0:
            raise ValueError(f"Time value must be >= 0, got {self.value}{unit.value}.")
        if unit != TimeUnit.DURATION:
            if float(self.value) != int(self.value):
                raise ValueError(
                    f"Time in '{unit.value}' must be a whole number, got {self.value}; "
                    f"only 'dur' takes fractions (e.g. '0.5dur')."
                )
            object.__setattr__(self, "value", int(self.value))
        else:
            object.__setattr__(self, "value", float(self.value))

    @classmethod
    def from_input(cls, value: TimeLike, default_unit: TimeUnit | None = None) -> Time:
        """Coerce a ``Time``, a string like ``"10ba"``, or a number with ``default_unit``.

        Raises:
            ValueError: the string does not parse, or a bare number has no default unit.
            TypeError: ``value`` is of another type.
        """
        if isinstance(value, Time):
            return value
        if isinstance(value, str):
            return cls.from_timestring(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if default_unit is None:
                raise ValueError(
                    f"Time {value!r} has no unit; write it as a string with one of {_UNIT_NAMES}, "
                    f"e.g. '{value}ba'."
                )
            return cls(value, default_unit)
        raise TypeError(f"Cannot make a Time from {value!r} (type {type(value).__name__}).")

    @classmethod
    def from_timestring(cls, timestring: str) -> Time:
        """Parse ``"2ep"``, ``"100ba"``, ``"1e6tok"``, ``"0.5dur"``...

        Raises:
            ValueError: naming the string and the valid units.
        """
        match = _TIME_RE.match(timestring)
        if match is None:
            raise ValueError(
                f"Invalid time string {timestring!r}: expected a number followed by a unit, one of "
                f"{_UNIT_NAMES} (e.g. '2ep', '100ba', '1e6tok', '0.5dur')."
            )
        number, suffix = match.groups()
        try:
            unit = TimeUnit(suffix)
        except ValueError:
            raise ValueError(
                f"Invalid time string {timestring!r}: unknown unit {suffix!r}; valid units are "
                f"{_UNIT_NAMES}."
            ) from None
        value = float(number)
        if unit != TimeUnit.DURATION and value != int(value):
            raise ValueError(
                f"Invalid time string {timestring!r}: '{suffix}' takes a whole number; "
                f"only 'dur' takes fractions."
            )
        return cls(value, unit)

    # Arithmetic and comparison between Times of the same unit.
    def _other(self, other: object) -> Time:
        if isinstance(other, (str, Time)):
            other = Time.from_input(other)
        elif isinstance(other, (int, float)) and not isinstance(other, bool):
            other = Time(other, self.unit)
        else:
            return NotImplemented  # type: ignore[return-value]
        if other.unit != self.unit:
            raise ValueError(
                f"Cannot combine {self} with {other}: units differ ('{self.unit.value}' vs "
                f"'{other.unit.value}'). Convert one first."
            )
        return other

    def __add__(self, other: object) -> Time:
        o = self._other(other)
        return Time(self.value + o.value, self.unit) if o is not NotImplemented else NotImplemented

    __radd__ = __add__

    def __sub__(self, other: object) -> Time:
        o = self._other(other)
        return Time(self.value - o.value, self.unit) if o is not NotImplemented else NotImplemented

    def __mul__(self, factor: float) -> Time:
        return Time(self.value * factor, self.unit)

    __rmul__ = __mul__

    def __truediv__(self, other: object) -> float:
        """Ratio of two Times of the same unit, a plain float."""
        o = self._other(other)
        return self.value / o.value

    def _cmp(self, other: object) -> tuple[float, float] | None:
        o = self._other(other)
        if o is NotImplemented:
            return None
        return self.value, o.value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Time, str)) or (
            isinstance(other, (int, float)) and not isinstance(other, bool)
        ):
            try:
                pair = self._cmp(other)
            except ValueError:
                return False
            return pair is not None and pair[0] == pair[1]
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.value, self.unit))

    def __lt__(self, other: object) -> bool:
        pair = self._cmp(other)
        return NotImplemented if pair is None else pair[0] < pair[1]

    def __le__(self, other: object) -> bool:
        pair = self._cmp(other)
        return NotImplemented if pair is None else pair[0] <= pair[1]

    def __gt__(self, other: object) -> bool:
        pair = self._cmp(other)
        return NotImplemented if pair is None else pair[0] > pair[1]

    def __ge__(self, other: object) -> bool:
        pair = self._cmp(other)
        return NotImplemented if pair is None else pair[0] >= pair[1]

    def __str__(self) -> str:
        value = self.value if self.unit == TimeUnit.DURATION else int(self.value)
        return f"{value}{self.unit.value}"

    def __repr__(self) -> str:
        return f"Time({self.value!r}, TimeUnit.{self.unit.name})"


TimeLike = Union[Time, str, int, float]


@dataclass(frozen=True)
class Timestamp:
    """Where a run is: totals since the start of training, and the position in the epoch.

    All counts are global (summed over ranks): ``sample`` and ``token`` count every rank's
    samples and tokens. ``batch`` counts optimizer steps. ``*_in_epoch`` reset at each epoch.

    A Timestamp compares with a :class:`Time` or a time string in any unit except ``dur``
    (which needs ``max_duration``; see :meth:`get` of ``State``): ``timestamp >= "100ba"``.
    """

    epoch: int = 0
    batch: int = 0
    sample: int = 0
    token: int = 0
    batch_in_epoch: int = 0
    sample_in_epoch: int = 0
    token_in_epoch: int = 0

    def get(self, unit: TimeUnit | str) -> Time:
        """The elapsed time in ``unit`` (not ``dur``).

        Raises:
            ValueError: for ``dur``, which needs ``max_duration`` (use ``State.get_elapsed_duration``).
        """
        unit = TimeUnit(unit)
        if unit == TimeUnit.DURATION:
            raise ValueError(
                "A Timestamp alone cannot give 'dur'; use State.get_elapsed_duration(), which "
                "knows max_duration."
            )
        attr = {TimeUnit.EPOCH: "epoch", TimeUnit.BATCH: "batch", TimeUnit.SAMPLE: "sample",
                TimeUnit.TOKEN: "token"}[unit]
        return Time(getattr(self, attr), unit)

    def to_next_batch(self, samples: int, tokens: int = 0) -> Timestamp:
        """The timestamp after one more optimizer step over ``samples`` samples, ``tokens`` tokens."""
        return replace(
            self,
            batch=self.batch + 1,
            sample=self.sample + samples,
            token=self.token + tokens,
            batch_in_epoch=self.batch_in_epoch + 1,
            sample_in_epoch=self.sample_in_epoch + samples,
            token_in_epoch=self.token_in_epoch + tokens,
        )

    def to_next_epoch(self) -> Timestamp:
        """The timestamp at the start of the next epoch (in-epoch counters reset)."""
        return replace(self, epoch=self.epoch + 1, batch_in_epoch=0, sample_in_epoch=0,
                       token_in_epoch=0)

    def state_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Timestamp:
        return cls(**{f.name: int(state[f.name]) for f in fields(cls)})

    def _time(self, other: object) -> Time | None:
        if isinstance(other, (Time, str)):
            return Time.from_input(other)
        return None

    def __lt__(self, other: object) -> bool:
        t = self._time(other)
        return NotImplemented if t is None else self.get(t.unit).value < t.value

    def __le__(self, other: object) -> bool:
        t = self._time(other)
        return NotImplemented if t is None else self.get(t.unit).value <= t.value

    def __gt__(self, other: object) -> bool:
        t = self._time(other)
        return NotImplemented if t is None else self.get(t.unit).value > t.value

    def __ge__(self, other: object) -> bool:
        t = self._time(other)
        return NotImplemented if t is None else self.get(t.unit).value >= t.value
