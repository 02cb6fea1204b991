"""Training time: :class:`Time` (a value and a unit) and :class:`Timestamp` (where a run is).

Units follow Composer's: ``iter`` (iterations), ``ep`` (epochs), ``ba`` (batches, i.e.
optimizer steps), ``sp`` (samples), ``tok`` (tokens), ``dur`` (a fraction of
``max_duration``) and ``sec`` (seconds of wall clock). A duration is written as a string
such as ``"2ep"``, ``"100ba"``, ``"4_096sp"``, ``"1e6tok"``, ``"0.5dur"``, ``"90sec"`` or
``"1h30m"`` and compared directly with a :class:`Timestamp`::

    if state.timestamp >= "100ba": ...

Every counter of a :class:`Timestamp` is a :class:`Time` (``state.timestamp.batch.value``
is the int), and a :class:`Time` compares and does arithmetic with plain numbers, which
take its unit (``state.timestamp.batch == 3``, ``state.timestamp.batch + 1``). In
f-strings a Time prints as its time string (``f"{t}"`` is ``"3ba"``); a format spec formats
the number (``f"{t:04d}"`` is ``"0003"``); ``int(t)`` is the number.

Differences from Composer, on purpose: a Time is falsy when its value is 0 (Composer's is
always truthy); ``operator.index`` works on whole-number units (so a Time can be a
``range`` bound); its hash is its number's, as a Time equals its number (``batch in {1, 3}``
works, and the hash is the same in every process; Composer's hashes the unit's string too,
which varies with ``PYTHONHASHSEED``). A Timestamp's ``state_dict`` stores the wall
clock as float seconds rather than ``timedelta`` objects, so checkpoints load with
``torch.load(weights_only=True)``; both forms load.

Source: the ``Time``/``Timestamp`` API of MosaicML Composer (``composer/core/time.py``).
"""

from __future__ import annotations

import datetime
import re
from enum import Enum
from typing import Any, Generic, Optional, TypeVar, Union

__all__ = [
    "Time", "TimeUnit", "Timestamp", "TimeLike", "ensure_time", "TimeUnitMismatchError",
    "NonIntegerTimeError",
]


class TimeUnitMismatchError(RuntimeError, ValueError):
    """Two :class:`Time` s of different units were compared or combined.

    A ``RuntimeError``, as Composer raises; also a ``ValueError``, as cadence raised before.
    """


class NonIntegerTimeError(TypeError, ValueError):
    """A fraction was given for a whole-number unit (only ``dur`` takes fractions).

    A ``TypeError``, as Composer raises; also a ``ValueError``, as cadence raised before.
    """


class TimeUnit(str, Enum):
    """The unit of a :class:`Time`. The value is the suffix used in time strings.

    ``TimeUnit("ep")``, ``TimeUnit("EP")`` and ``TimeUnit("EPOCH")`` are all ``EPOCH``.
    """

    ITERATION = "iter"
    EPOCH = "ep"
    BATCH = "ba"
    SAMPLE = "sp"
    TOKEN = "tok"
    DURATION = "dur"
    SECOND = "sec"

    @classmethod
    def _missing_(cls, value: object) -> Optional[TimeUnit]:
        if isinstance(value, str):
            lowered = value.lower()
            for member in cls:
                if member.value == lowered or member.name.lower() == lowered:
                    return member
        return None

    def __str__(self) -> str:
        return self.value


_UNIT_INDEX = {unit: index for index, unit in enumerate(TimeUnit)}
_UNIT_NAMES = ", ".join(f"'{u.value}'" for u in TimeUnit)
_TIME_RE = re.compile(
    r"^\s*(.+?)\s*(" + "|".join(sorted((u.value for u in TimeUnit), key=len, reverse=True))
    + r")\s*$",
    flags=re.IGNORECASE,
)
_WALL_CLOCK_RE = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")

TValue = TypeVar("TValue", int, float)


def _whole(value: Any, unit: TimeUnit) -> int:
    """``value`` as an int for a whole-number unit; raises :class:`NonIntegerTimeError`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if hasattr(value, "__index__") and not isinstance(value, bool):
        return value.__index__()  # numpy / torch integers
    raise NonIntegerTimeError(
        f"Time in '{unit.value}' must be a whole number, got {value!r} "
        f"({type(value).__name__}); only 'dur' takes fractions (e.g. '0.5dur')."
    )



class TimeInputError(TypeError, RuntimeError):
    """``Time.from_input`` got neither a Time, a time string nor a number: a ``TypeError``
    (cadence's) and a ``RuntimeError`` (what Composer raises, and its code catches)."""


class Time(Generic[TValue]):
    """An amount of training time: ``value`` in ``unit``. ``Time[int]`` / ``Time[float]``
    in annotations.

    Args:
        value: an ``int`` for every unit but ``dur`` (a whole float such as ``2.0`` is
            accepted and stored as ``2``), a ``float`` for ``dur`` (1.0 is all of
            ``max_duration``). Negative values are allowed (``Time(1, "ba") - 3``).
        unit: a :class:`TimeUnit` or its string (``"ba"``).

    Comparison and ``+ - * / %`` work between Times of one unit, and with plain numbers,
    which take this Time's unit (``Time(3, "ba") + 1 == Time(4, "ba")``) as in Composer.
    ``Time / Time`` is a ``dur`` Time; ``Time * number`` and ``Time / number`` scale.

    Raises:
        NonIntegerTimeError: a fraction for a whole-number unit (a ``TypeError``).
        ValueError: an unknown unit.
        TimeUnitMismatchError: comparing or combining different units (a ``RuntimeError``).
    """

    __slots__ = ("_value", "_unit")

    def __init__(self, value: TValue, unit: Union[str, TimeUnit]) -> None:
        unit = unit if type(unit) is TimeUnit else TimeUnit(unit)
        self._unit = unit
        self._value = float(value) if unit is TimeUnit.DURATION else _whole(value, unit)

    @classmethod
    def _make(cls, value: Any, unit: TimeUnit) -> Time:
        """Construct without validation (``value`` already of the right type): the hot path."""
        time = object.__new__(cls)
        time._value = value
        time._unit = unit
        return time

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_iteration(cls, iteration: int) -> Time[int]:
        """``Time(iteration, TimeUnit.ITERATION)``."""
        return cls(iteration, TimeUnit.ITERATION)

    @classmethod
    def from_epoch(cls, epoch: int) -> Time[int]:
        """``Time(epoch, TimeUnit.EPOCH)``."""
        return cls(epoch, TimeUnit.EPOCH)

    @classmethod
    def from_batch(cls, batch: int) -> Time[int]:
        """``Time(batch, TimeUnit.BATCH)``."""
        return cls(batch, TimeUnit.BATCH)

    @classmethod
    def from_sample(cls, sample: int) -> Time[int]:
        """``Time(sample, TimeUnit.SAMPLE)``."""
        return cls(sample, TimeUnit.SAMPLE)

    @classmethod
    def from_token(cls, token: int) -> Time[int]:
        """``Time(token, TimeUnit.TOKEN)``."""
        return cls(token, TimeUnit.TOKEN)

    @classmethod
    def from_duration(cls, duration: float) -> Time[float]:
        """``Time(duration, TimeUnit.DURATION)``: a fraction of ``max_duration``."""
        return cls(duration, TimeUnit.DURATION)

    @classmethod
    def from_second(cls, second: int) -> Time[int]:
        """``Time(second, TimeUnit.SECOND)``: seconds of wall clock."""
        return cls(second, TimeUnit.SECOND)

    @classmethod
    def from_timedelta(cls, timestring: str) -> Time[int]:
        """Parse a wall-clock string ``"1h30m"``, ``"90s"``, ``"2h"`` into seconds (``sec``).

        The empty string is 0 seconds, as in Composer (whose ``Time.from_input('')`` is
        ``Time(0, TimeUnit.SECOND)``).

        Raises:
            ValueError: ``timestring`` is not of the form ``XXhYYmZZs`` (each part optional).
        """
        if timestring == "":
            return cls(0, TimeUnit.SECOND)
        match = _WALL_CLOCK_RE.match(timestring.strip())
        if match is None or not any(match.groups()):
            raise ValueError(
                f"Invalid wall-clock string {timestring!r}: expected hours, minutes and "
                f"seconds such as '1h30m', '45m' or '90s'."
            )
        hours, minutes, seconds = (int(part or 0) for part in match.groups())
        return cls(hours * 3600 + minutes * 60 + seconds, TimeUnit.SECOND)

    @classmethod
    def from_input(cls, i: TimeLike, default_int_unit: Optional[Union[TimeUnit, str]] = None
                   ) -> Time:
        """Coerce a ``Time``, a time string such as ``"10ba"``, or a number with
        ``default_int_unit``.

        Raises:
            TimeUnitMismatchError: a bare number and no ``default_int_unit`` (a
                ``RuntimeError`` as in Composer, and a ``ValueError``).
            ValueError: the string does not parse.
            TypeError: ``i`` is of another type.
        """
        if isinstance(i, Time):
            return i
        if isinstance(i, str):
            return cls.from_timestring(i)
        if isinstance(i, (int, float)) and not isinstance(i, bool):
            if default_int_unit is None:
                raise TimeUnitMismatchError(
                    f"Time {i!r} has no unit; write it as a string with one of {_UNIT_NAMES}, "
                    f"e.g. '{i}ba'."
                )
            return cls(i, default_int_unit)
        raise TimeInputError(f"Cannot make a Time from {i!r} (type {type(i).__name__}); give a "
                        f"Time, a time string such as '10ba', or a number with a unit.")

    @classmethod
    def from_timestring(cls, timestring: str) -> Time:
        """Parse ``"2ep"``, ``"100ba"``, ``"4_000tok"``, ``"1e6tok"``, ``"0.5dur"``,
        ``"90sec"``, ``"-3ba"``, or a wall-clock string ``"1h30m"`` (seconds).

        Raises:
            ValueError: naming the string and the valid units.
            NonIntegerTimeError: a fraction for a whole-number unit (``"1.5ep"``).
        """
        if not isinstance(timestring, str):
            raise TypeError(f"A time string must be a str, got {type(timestring).__name__}.")
        try:
            return cls.from_timedelta(timestring)
        except ValueError:
            pass
        match = _TIME_RE.match(timestring)
        if match is None:
            raise ValueError(
                f"Invalid time string {timestring!r}: expected a number followed by a unit, one "
                f"of {_UNIT_NAMES} (e.g. '2ep', '100ba', '1e6tok', '0.5dur', '90sec')."
            )
        number, suffix = match.groups()
        try:
            value = float(number)
        except ValueError:
            raise ValueError(
                f"Invalid time string {timestring!r}: {number!r} is not a number; expected a "
                f"number followed by a unit, one of {_UNIT_NAMES} (e.g. '2ep', '4_000tok')."
            ) from None
        unit = TimeUnit(suffix)
        if unit is not TimeUnit.DURATION and not value.is_integer():
            raise NonIntegerTimeError(
                f"Invalid time string {timestring!r}: '{unit.value}' takes a whole number; "
                f"only 'dur' takes fractions."
            )
        return cls(value, unit)

    # ------------------------------------------------------------------ accessors
    @property
    def value(self) -> TValue:
        """The number (``int``, or ``float`` for ``dur``)."""
        return self._value  # type: ignore[return-value]

    @property
    def unit(self) -> TimeUnit:
        """The :class:`TimeUnit`."""
        return self._unit

    def to_timestring(self) -> str:
        """The time string, e.g. ``"5ep"`` (what :meth:`from_timestring` parses)."""
        return str(self)

    def __str__(self) -> str:
        return f"{self._value}{self._unit.value}"

    def __repr__(self) -> str:
        return f"Time({self._value!r}, TimeUnit.{self._unit.name})"

    def __format__(self, spec: str) -> str:
        """No spec: the time string (``"3ba"``); a spec formats the number (``{t:03d}``)."""
        return str(self) if not spec else format(self._value, spec)

    def __int__(self) -> int:
        return int(self._value)

    def __float__(self) -> float:
        return float(self._value)

    def __index__(self) -> int:
        if self._unit is TimeUnit.DURATION:
            raise TypeError(f"{self} is a fraction ('dur'); it cannot be used as an index.")
        return self._value  # type: ignore[return-value]

    def __bool__(self) -> bool:
        return bool(self._value)

    def __hash__(self) -> int:
        # value and unit, as Composer hashes: Times of different units can share a set or a
        # dict (equal hashes would make the set compare them, which raises). The unit enters
        # as its position, so the hash is the same in every process (a str's is salted).
        return hash((self._value, _UNIT_INDEX[self._unit]))

    def __getstate__(self) -> tuple[Any, str]:
        return self._value, self._unit.value

    def __setstate__(self, state: tuple[Any, str]) -> None:
        self._value, self._unit = state[0], TimeUnit(state[1])

    # ------------------------------------------------------------------ comparison
    def _parse(self, other: object) -> Time:
        """``other`` as a Time of this unit; numbers take this unit (Composer's rule)."""
        if isinstance(other, Time):
            parsed = other
        elif isinstance(other, str):
            parsed = Time.from_timestring(other)
        elif isinstance(other, (int, float)) and not isinstance(other, bool):
            parsed = Time(other, self._unit)
        else:
            return NotImplemented  # type: ignore[return-value]
        if parsed._unit is not self._unit:
            raise TimeUnitMismatchError(
                f"Cannot combine or compare {self} with {parsed}: the units differ "
                f"('{self._unit.value}' vs '{parsed._unit.value}'). Convert one first."
            )
        return parsed

    def _other_value(self, other: object) -> Any:
        # Plain numbers compare by value without building a Time (hot path in the loop).
        if type(other) is int or type(other) is float:
            return other
        parsed = self._parse(other)
        return NotImplemented if parsed is NotImplemented else parsed._value

    def __eq__(self, other: object) -> bool:
        value = self._other_value(other)
        return NotImplemented if value is NotImplemented else self._value == value

    def __ne__(self, other: object) -> bool:
        value = self._other_value(other)
        return NotImplemented if value is NotImplemented else self._value != value

    def __lt__(self, other: object) -> bool:
        value = self._other_value(other)
        return NotImplemented if value is NotImplemented else self._value < value

    def __le__(self, other: object) -> bool:
        value = self._other_value(other)
        return NotImplemented if value is NotImplemented else self._value <= value

    def __gt__(self, other: object) -> bool:
        value = self._other_value(other)
        return NotImplemented if value is NotImplemented else self._value > value

    def __ge__(self, other: object) -> bool:
        value = self._other_value(other)
        return NotImplemented if value is NotImplemented else self._value >= value

    # ------------------------------------------------------------------ arithmetic
    def __add__(self, other: object) -> Time[TValue]:
        parsed = self._parse(other)
        if parsed is NotImplemented:
            return NotImplemented
        return Time._make(self._value + parsed._value, self._unit)

    __radd__ = __add__

    def __sub__(self, other: object) -> Time[TValue]:
        parsed = self._parse(other)
        if parsed is NotImplemented:
            return NotImplemented
        return Time._make(self._value - parsed._value, self._unit)

    def __rsub__(self, other: object) -> Time[TValue]:
        parsed = self._parse(other)
        if parsed is NotImplemented:
            return NotImplemented
        return Time._make(parsed._value - self._value, self._unit)

    def __neg__(self) -> Time[TValue]:
        return Time._make(-self._value, self._unit)

    def __pos__(self) -> Time[TValue]:
        return Time._make(self._value, self._unit)

    def __abs__(self) -> Time[TValue]:
        return Time._make(abs(self._value), self._unit)

    def __mul__(self, other: object) -> Time:
        """``Time * number`` scales (keeps the unit, truncated to int for whole units);
        ``Time * Time`` needs one of them in ``dur``."""
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return Time(type(self._value)(self._value * other), self._unit)
        if isinstance(other, str):
            other = Time.from_timestring(other)
        if not isinstance(other, Time):
            return NotImplemented
        if TimeUnit.DURATION not in (self._unit, other._unit):
            raise TimeUnitMismatchError(
                f"Cannot multiply {self} by {other}: one of them must be in 'dur'.")
        unit = self._unit if other._unit is TimeUnit.DURATION else other._unit
        product = self._value * other._value
        return Time(product if unit is TimeUnit.DURATION else int(product), unit)

    __rmul__ = __mul__

    def __truediv__(self, other: object) -> Time:
        """``Time / Time`` (one unit) is a ``dur`` Time; ``Time / number`` scales."""
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return Time(type(self._value)(self._value / other), self._unit)
        parsed = self._parse(other)
        if parsed is NotImplemented:
            return NotImplemented
        return Time._make(self._value / parsed._value, TimeUnit.DURATION)

    def __mod__(self, other: object) -> Time[TValue]:
        parsed = self._parse(other)
        if parsed is NotImplemented:
            return NotImplemented
        return Time._make(self._value % parsed._value, self._unit)


TimeLike = Union[Time, str, int, float]


def ensure_time(maybe_time: TimeLike, int_unit: Union[TimeUnit, str]) -> Time:
    """``maybe_time`` as a :class:`Time`; a bare number is in ``int_unit`` (Composer's helper)."""
    return Time.from_input(maybe_time, int_unit)


_COUNTERS = (
    ("iteration", TimeUnit.ITERATION), ("epoch", TimeUnit.EPOCH), ("batch", TimeUnit.BATCH),
    ("sample", TimeUnit.SAMPLE), ("token", TimeUnit.TOKEN),
    ("epoch_in_iteration", TimeUnit.EPOCH), ("token_in_iteration", TimeUnit.TOKEN),
    ("batch_in_epoch", TimeUnit.BATCH), ("sample_in_epoch", TimeUnit.SAMPLE),
    ("token_in_epoch", TimeUnit.TOKEN),
)
_CLOCKS = ("total_wct", "iteration_wct", "epoch_wct", "batch_wct")
_ZERO = datetime.timedelta(0)


def _as_counter(name: str, unit: TimeUnit, value: Union[int, Time]) -> Time:
    time = Time.from_input(value, unit)
    if time.unit is not unit:
        raise ValueError(f"Timestamp's `{name}` must be in '{unit.value}', got {time}.")
    return time


def _as_clock(name: str, value: Union[datetime.timedelta, float, int, None]) -> datetime.timedelta:
    if value is None:
        return _ZERO
    if isinstance(value, datetime.timedelta):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.timedelta(seconds=value)
    raise TypeError(f"Timestamp's `{name}` must be a datetime.timedelta or seconds, got "
                    f"{type(value).__name__}.")


class Timestamp:
    """Where a run is: totals since the start of training, and positions in the epoch.

    Every counter is a :class:`Time` of its unit (``timestamp.batch.value`` is the int);
    the wall clocks are ``datetime.timedelta``. A Timestamp is not changed in place: the
    loop replaces it with :meth:`to_next_batch` / :meth:`to_next_epoch`.

    Counts are global (summed over ranks): ``sample`` and ``token`` count every rank's
    samples and tokens; ``batch`` counts optimizer steps; ``*_in_epoch`` restart at each
    epoch. A Timestamp compares with a :class:`Time` or a time string in any unit but
    ``dur`` (which needs ``max_duration``): ``timestamp >= "100ba"``; ``sec`` compares the
    whole seconds of ``total_wct``.

    Args:
        iteration, epoch, batch, sample, token, epoch_in_iteration, token_in_iteration,
        batch_in_epoch, sample_in_epoch, token_in_epoch: ints or Times of the field's unit;
            default 0.
        total_wct: wall clock since training started; ``iteration_wct`` / ``epoch_wct``:
            since the iteration / epoch started; ``batch_wct``: the last batch's. Each a
            ``datetime.timedelta`` (or seconds); default 0.

    Raises:
        ValueError: a counter given as a Time of another unit.
    """

    __slots__ = tuple(f"_{name}" for name, _ in _COUNTERS) + tuple(f"_{name}" for name in _CLOCKS)

    def __init__(
        self,
        iteration: Union[int, Time[int]] = 0,
        epoch: Union[int, Time[int]] = 0,
        batch: Union[int, Time[int]] = 0,
        sample: Union[int, Time[int]] = 0,
        token: Union[int, Time[int]] = 0,
        epoch_in_iteration: Union[int, Time[int]] = 0,
        token_in_iteration: Union[int, Time[int]] = 0,
        batch_in_epoch: Union[int, Time[int]] = 0,
        sample_in_epoch: Union[int, Time[int]] = 0,
        token_in_epoch: Union[int, Time[int]] = 0,
        total_wct: Optional[datetime.timedelta] = None,
        iteration_wct: Optional[datetime.timedelta] = None,
        epoch_wct: Optional[datetime.timedelta] = None,
        batch_wct: Optional[datetime.timedelta] = None,
    ) -> None:
        values = locals()
        for name, unit in _COUNTERS:
            object.__setattr__(self, f"_{name}", _as_counter(name, unit, values[name]))
        for name in _CLOCKS:
            object.__setattr__(self, f"_{name}", _as_clock(name, values[name]))

    # ------------------------------------------------------------------ fields
    @property
    def iteration(self) -> Time[int]:
        """Iterations completed (cadence trains one iteration: always 0 during ``fit``)."""
        return self._iteration

    @property
    def epoch(self) -> Time[int]:
        """Epochs completed."""
        return self._epoch

    @property
    def batch(self) -> Time[int]:
        """Optimizer steps completed."""
        return self._batch

    @property
    def sample(self) -> Time[int]:
        """Samples trained on, over all ranks."""
        return self._sample

    @property
    def token(self) -> Time[int]:
        """Tokens trained on, over all ranks (0 unless the model counts tokens)."""
        return self._token

    @property
    def epoch_in_iteration(self) -> Time[int]:
        """Epochs completed in the current iteration."""
        return self._epoch_in_iteration

    @epoch_in_iteration.setter
    def epoch_in_iteration(self, value: Union[int, Time[int]]) -> None:
        self._epoch_in_iteration = _as_counter("epoch_in_iteration", TimeUnit.EPOCH, value)

    @property
    def token_in_iteration(self) -> Time[int]:
        """Tokens trained on in the current iteration."""
        return self._token_in_iteration

    @property
    def batch_in_epoch(self) -> Time[int]:
        """Optimizer steps completed in the current epoch."""
        return self._batch_in_epoch

    @property
    def sample_in_epoch(self) -> Time[int]:
        """Samples trained on in the current epoch."""
        return self._sample_in_epoch

    @property
    def token_in_epoch(self) -> Time[int]:
        """Tokens trained on in the current epoch."""
        return self._token_in_epoch

    @property
    def total_wct(self) -> datetime.timedelta:
        """Wall clock of training so far (sum of the batches' ``batch_wct``)."""
        return self._total_wct

    @property
    def iteration_wct(self) -> datetime.timedelta:
        """Wall clock of the current iteration."""
        return self._iteration_wct

    @property
    def epoch_wct(self) -> datetime.timedelta:
        """Wall clock of the current epoch."""
        return self._epoch_wct

    @property
    def batch_wct(self) -> datetime.timedelta:
        """Wall clock of the last batch."""
        return self._batch_wct

    def get(self, unit: Union[str, TimeUnit]) -> Time[int]:
        """The elapsed time in ``unit`` (``sec``: whole seconds of ``total_wct``).

        Raises:
            ValueError: for ``dur``, which needs ``max_duration`` (use
                ``State.get_elapsed_duration``).
        """
        unit = TimeUnit(unit)
        if unit is TimeUnit.BATCH:
            return self._batch
        if unit is TimeUnit.EPOCH:
            return self._epoch
        if unit is TimeUnit.SAMPLE:
            return self._sample
        if unit is TimeUnit.TOKEN:
            return self._token
        if unit is TimeUnit.ITERATION:
            return self._iteration
        if unit is TimeUnit.SECOND:
            return Time._make(int(self._total_wct.total_seconds()), TimeUnit.SECOND)
        raise ValueError(
            "A Timestamp alone cannot give 'dur'; use State.get_elapsed_duration(), which "
            "knows max_duration."
        )

    # ------------------------------------------------------------------ advancing
    def copy(self, **changes: Any) -> Timestamp:
        """A copy with the given fields replaced (ints or Times; timedeltas for the clocks).

        Takes the same keyword arguments as the constructor.

        Raises:
            TypeError: an unknown field name.
        """
        new = object.__new__(Timestamp)
        for slot in Timestamp.__slots__:
            object.__setattr__(new, slot, getattr(self, slot))
        units = dict(_COUNTERS)
        for name, value in changes.items():
            if value is None:
                continue
            if name in units:
                object.__setattr__(new, f"_{name}", _as_counter(name, units[name], value))
            elif name in _CLOCKS:
                object.__setattr__(new, f"_{name}", _as_clock(name, value))
            else:
                raise TypeError(f"Timestamp.copy() got an unknown field {name!r}; fields are "
                                f"{[n for n, _ in _COUNTERS] + list(_CLOCKS)}.")
        return new

    def to_next_batch(
        self,
        samples: Union[int, Time] = 0,
        tokens: Union[int, Time] = 0,
        duration: Optional[datetime.timedelta] = None,
    ) -> Timestamp:
        """The timestamp after one more optimizer step over ``samples`` samples and
        ``tokens`` tokens (totals over all ranks), which took ``duration`` of wall clock.

        ``batch``, ``sample``, ``token`` and their ``*_in_epoch`` twins advance,
        ``token_in_iteration`` too; the wall clocks add ``duration``; ``batch_wct`` becomes it.
        """
        samples, tokens = int(samples), int(tokens)
        duration = _ZERO if duration is None else duration
        new = object.__new__(Timestamp)
        make, batch_unit, sample_unit, token_unit = (
            Time._make, TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN)
        new._iteration, new._epoch = self._iteration, self._epoch
        new._epoch_in_iteration = self._epoch_in_iteration
        new._batch = make(self._batch._value + 1, batch_unit)
        new._batch_in_epoch = make(self._batch_in_epoch._value + 1, batch_unit)
        new._sample = make(self._sample._value + samples, sample_unit)
        new._sample_in_epoch = make(self._sample_in_epoch._value + samples, sample_unit)
        new._token = make(self._token._value + tokens, token_unit)
        new._token_in_epoch = make(self._token_in_epoch._value + tokens, token_unit)
        new._token_in_iteration = make(self._token_in_iteration._value + tokens, token_unit)
        new._total_wct = self._total_wct + duration
        new._iteration_wct = self._iteration_wct + duration
        new._epoch_wct = self._epoch_wct + duration
        new._batch_wct = duration
        return new

    def to_next_epoch(self, duration: Optional[datetime.timedelta] = None) -> Timestamp:
        """The timestamp at the start of the next epoch: ``epoch`` advances, the
        ``*_in_epoch`` counters and ``epoch_wct``/``batch_wct`` restart; ``duration`` (wall
        clock since the last batch) is added to ``total_wct``/``iteration_wct``."""
        duration = _ZERO if duration is None else duration
        return self.copy(
            epoch=self._epoch + 1, epoch_in_iteration=self._epoch_in_iteration + 1,
            batch_in_epoch=0, sample_in_epoch=0, token_in_epoch=0,
            total_wct=self._total_wct + duration, iteration_wct=self._iteration_wct + duration,
            epoch_wct=_ZERO, batch_wct=_ZERO,
        )

    def to_next_iteration(self, duration: Optional[datetime.timedelta] = None) -> Timestamp:
        """The timestamp at the start of the next iteration: ``iteration`` advances, the
        in-iteration and in-epoch counters and every clock but ``total_wct`` restart."""
        duration = _ZERO if duration is None else duration
        return self.copy(
            iteration=self._iteration + 1, epoch_in_iteration=0, token_in_iteration=0,
            batch_in_epoch=0, sample_in_epoch=0, token_in_epoch=0,
            total_wct=self._total_wct + duration,
            iteration_wct=_ZERO, epoch_wct=_ZERO, batch_wct=_ZERO,
        )

    # ------------------------------------------------------------------ serialization
    def state_dict(self) -> dict[str, Union[int, float]]:
        """Plain numbers: counters as ints, clocks as float seconds (``weights_only``-safe)."""
        out: dict[str, Union[int, float]] = {
            name: getattr(self, f"_{name}")._value for name, _ in _COUNTERS}
        out.update({name: getattr(self, f"_{name}").total_seconds() for name in _CLOCKS})
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` in place (missing fields, from older checkpoints, are 0)."""
        restored = Timestamp.from_state_dict(state)
        for slot in Timestamp.__slots__:
            object.__setattr__(self, slot, getattr(restored, slot))

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Timestamp:
        """A Timestamp from :meth:`state_dict` (clocks as seconds or timedeltas)."""
        kwargs: dict[str, Any] = {name: int(state.get(name, 0)) for name, _ in _COUNTERS}
        kwargs.update({name: state.get(name) for name in _CLOCKS})
        return cls(**kwargs)

    # ------------------------------------------------------------------ comparison
    def _time(self, other: object) -> Optional[Time]:
        if isinstance(other, Time):
            return other
        if isinstance(other, str):
            return Time.from_timestring(other)
        return None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Timestamp):
            return self.state_dict() == other.state_dict()
        t = self._time(other)
        return NotImplemented if t is None else self.get(t.unit) == t

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None  # type: ignore[assignment]

    def __lt__(self, other: object) -> bool:
        t = self._time(other)
        return NotImplemented if t is None else self.get(t.unit) < t

    def __le__(self, other: object) -> bool:
        t = self._time(other)
        return NotImplemented if t is None else self.get(t.unit) <= t

    def __gt__(self, other: object) -> bool:
        t = self._time(other)
        return NotImplemented if t is None else self.get(t.unit) > t

    def __ge__(self, other: object) -> bool:
        t = self._time(other)
        return NotImplemented if t is None else self.get(t.unit) >= t

    def __repr__(self) -> str:
        counters = ", ".join(f"{name}={getattr(self, f'_{name}')._value}" for name, _ in _COUNTERS)
        clocks = ", ".join(f"{name}={getattr(self, f'_{name}')!r}" for name in _CLOCKS)
        return f"Timestamp({counters}, {clocks})"
