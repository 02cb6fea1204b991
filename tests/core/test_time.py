"""Time and Timestamp, tested against Composer's documented API (``composer/core/time.py``)."""

from __future__ import annotations

import copy
import datetime
import os
import pickle
import subprocess
import sys

import pytest

from cadence import Time, Timestamp, TimeUnit
from cadence.core import ensure_time


@pytest.mark.parametrize(
    ("text", "value", "unit"),
    [("2ep", 2, TimeUnit.EPOCH), ("100ba", 100, TimeUnit.BATCH), ("4096sp", 4096, TimeUnit.SAMPLE),
     ("1e6tok", 1_000_000, TimeUnit.TOKEN), ("0.5dur", 0.5, TimeUnit.DURATION),
     (" 3 ba ", 3, TimeUnit.BATCH), ("4_000tok", 4000, TimeUnit.TOKEN),
     ("3iter", 3, TimeUnit.ITERATION), ("90sec", 90, TimeUnit.SECOND),
     ("-3ba", -3, TimeUnit.BATCH), ("2EP", 2, TimeUnit.EPOCH),
     ("1h30m", 5400, TimeUnit.SECOND), ("45s", 45, TimeUnit.SECOND), ("2m", 120, TimeUnit.SECOND)],
)
def test_parse(text: str, value: float, unit: TimeUnit) -> None:
    t = Time.from_timestring(text)
    assert t.value == value and t.unit == unit
    assert isinstance(t.value, float if unit == TimeUnit.DURATION else int)


@pytest.mark.parametrize("text", ["2epochs", "ba", "10", "abc", "2 e p", "1x5ba"])
def test_bad_strings_name_the_string_and_units(text: str) -> None:
    with pytest.raises(ValueError) as info:
        Time.from_timestring(text)
    message = str(info.value)
    assert repr(text) in message
    assert "'ep'" in message and "'tok'" in message and "'dur'" in message


def test_fraction_only_for_dur_raises_composers_type_error() -> None:
    with pytest.raises(TypeError, match="whole number"):
        Time.from_timestring("1.5ep")
    with pytest.raises(TypeError, match="whole number"):
        Time(2.5, TimeUnit.BATCH)
    with pytest.raises(ValueError):  # also a ValueError, as cadence raised before
        Time(2.5, "ba")
    assert Time(2.0, "ba").value == 2 and isinstance(Time(2.0, "ba").value, int)
    assert Time(1, "dur").value == 1.0 and isinstance(Time(1, "dur").value, float)


def test_units_and_their_names() -> None:
    assert [u.value for u in TimeUnit] == ["iter", "ep", "ba", "sp", "tok", "dur", "sec"]
    assert TimeUnit("EPOCH") is TimeUnit.EPOCH and TimeUnit("Ba") is TimeUnit.BATCH
    with pytest.raises(ValueError):
        TimeUnit("parsec")


def test_constructors() -> None:
    assert Time.from_epoch(2) == Time(2, TimeUnit.EPOCH)
    assert Time.from_batch(3) == Time(3, TimeUnit.BATCH)
    assert Time.from_sample(4) == Time(4, TimeUnit.SAMPLE)
    assert Time.from_token(5) == Time(5, TimeUnit.TOKEN)
    assert Time.from_duration(0.25) == Time(0.25, TimeUnit.DURATION)
    assert Time.from_iteration(1) == Time(1, TimeUnit.ITERATION)
    assert Time.from_timestring("7ba") == Time(7, "ba")
    assert Time.from_input("7ba") == Time.from_input(7, "ba") == ensure_time(7, TimeUnit.BATCH)
    assert Time[int] is not None and Time[float] is not None  # subscriptable (Generic)


def test_to_timestring_str_repr_and_format() -> None:
    t = Time(5, TimeUnit.EPOCH)
    assert t.to_timestring() == "5ep" == str(t) == f"{t}" == "{}".format(t)
    assert Time.from_timestring(t.to_timestring()) == t
    assert repr(t) == "Time(5, TimeUnit.EPOCH)"
    assert f"{t:03d}" == "005" and "ep{:d}".format(t) == "ep5"
    assert str(Time.from_timestring("1e6tok")) == "1000000tok"
    assert str(Time.from_timestring("0.25dur")) == "0.25dur"


def test_arithmetic_with_times_and_plain_numbers() -> None:
    a, b = Time.from_timestring("10ba"), Time(4, "ba")
    assert a + b == Time(14, TimeUnit.BATCH) and a - b == "6ba"
    assert b - a == Time(-6, "ba")  # negative results are allowed
    assert -a == Time(-10, "ba") and +a == a
    assert a + 1 == Time(11, "ba") and 1 + a == Time(11, "ba")
    assert 12 - a == Time(2, "ba")
    assert a * 3 == "30ba" and 3 * a == "30ba"
    assert a * 0.5 == Time(5, "ba") and a / 2 == Time(5, "ba")
    assert a / b == Time(2.5, TimeUnit.DURATION)
    assert a * Time(0.5, "dur") == Time(5, "ba")
    assert a % 3 == Time(1, "ba") and a % Time(4, "ba") == Time(2, "ba")
    assert int(a) == 10 and float(a) == 10.0 and a.value == 10
    assert range(a)[-1] == 9 and [0, 1, 2][Time(1, "ba")] == 1  # __index__ on whole units
    assert bool(Time(0, "ba")) is False and bool(a) is True


def test_comparison_with_times_strings_and_numbers() -> None:
    a = Time(10, "ba")
    assert a == 10 and a != 11 and a < 11 and a <= 10 and a > 9.5 and a >= 10
    assert a > "9ba" and a >= "10ba" and a <= "10ba" and a == Time(10, "ba")
    assert Time(4, "ba") < a and sorted([a, Time(2, "ba")]) == [Time(2, "ba"), a]
    assert (a == None) is False  # noqa: E711


def test_different_units_raise_composers_runtime_error() -> None:
    a = Time(10, "ba")
    for op in (lambda: a < Time(1, "ep"), lambda: a == Time(10, "ep"), lambda: a + "1ep",
               lambda: a - Time(1, "sp"), lambda: a / Time(1, "ep"), lambda: a * Time(2, "ep")):
        with pytest.raises(RuntimeError, match="ba"):
            op()
    with pytest.raises(ValueError):  # also a ValueError, as cadence raised before
        _ = a < Time(1, "ep")
    with pytest.raises(RuntimeError, match="has no unit"):
        Time.from_input(3)
    with pytest.raises(TypeError):
        Time.from_input([3])  # type: ignore[arg-type]


def test_hash_pickle_and_copy() -> None:
    a = Time(3, "ba")
    assert {a: 1}[Time(3, "ba")] == 1 and hash(a) == hash(Time(3, "ba"))
    assert hash(Time(2, "dur")) == hash(Time(2.0, "dur"))  # equal Times hash equal
    assert pickle.loads(pickle.dumps(a)) == a and copy.deepcopy(a) == a


def test_times_of_mixed_units_share_a_set_and_a_dict() -> None:
    # the hash holds the unit (as Composer's does): a set of mixed units never compares
    # Times of different units, which would raise TimeUnitMismatchError
    times = {Time(3, "ba"), Time(3, "ep"), Time(3, "sp"), Time(3, "ba")}
    assert len(times) == 3 and Time(3, "ep") in times and Time(3, "tok") not in times
    by_time = {Time(3, "ba"): "batches", Time(3, "ep"): "epochs", Time(3, "tok"): "tokens"}
    assert by_time[Time(3, "ep")] == "epochs" and by_time[Time.from_timestring("3tok")] == "tokens"
    assert len(by_time) == 3


def test_time_hash_is_the_same_in_every_process() -> None:
    # no salted string in it: a fresh interpreter (another PYTHONHASHSEED) agrees
    code = "from cadence.core.time import Time; print(hash(Time(3, 'ep')), hash(Time(0.5, 'dur')))"
    outputs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1
    assert outputs.pop().split() == [str(hash(Time(3, "ep"))), str(hash(Time(0.5, "dur")))]


def test_timestamp_fields_are_times() -> None:
    ts = Timestamp()
    for _ in range(5):
        ts = ts.to_next_batch(samples=8, tokens=8 * 64,
                              duration=datetime.timedelta(seconds=1.5))
    assert isinstance(ts.batch, Time) and ts.batch.unit == TimeUnit.BATCH
    assert ts.batch.value == 5 and ts.sample == Time(40, "sp") and ts.token == Time(2560, "tok")
    assert ts.batch_in_epoch == Time(5, "ba") and ts.sample_in_epoch == 40
    assert ts.token_in_epoch == 2560 and ts.token_in_iteration == 2560
    assert ts.total_wct == datetime.timedelta(seconds=7.5) == ts.epoch_wct
    assert ts.batch_wct == datetime.timedelta(seconds=1.5)
    assert ts.get("sec") == Time(7, TimeUnit.SECOND) and ts >= "7sec" and ts < "8sec"
    ts = ts.to_next_epoch(duration=datetime.timedelta(seconds=1))
    assert ts.epoch == Time(1, "ep") and ts.epoch_in_iteration == 1
    assert ts.batch_in_epoch == 0 and ts.sample_in_epoch == 0 and ts.token_in_epoch == 0
    assert ts.epoch_wct == datetime.timedelta(0) and ts.total_wct.total_seconds() == 8.5
    assert ts.batch == 5  # totals kept
    ts = ts.to_next_iteration()
    assert ts.iteration == Time(1, "iter") and ts.epoch_in_iteration == 0
    assert ts.token_in_iteration == 0 and ts.token == 2560


def test_timestamp_compares_with_strings_and_round_trips() -> None:
    ts = Timestamp()
    for _ in range(5):
        ts = ts.to_next_batch(samples=8, tokens=8 * 64)
    ts = ts.to_next_epoch()
    assert ts >= "5ba" and ts < "6ba" and ts > "39sp" and ts <= "40sp"
    assert ts >= "2560tok" and ts == Timestamp.from_state_dict(ts.state_dict())
    assert ts >= "1ep" and ts.batch_in_epoch == 0 and ts.batch == 5
    restored = Timestamp()
    restored.load_state_dict(ts.state_dict())
    assert restored == ts and restored != Timestamp()
    with pytest.raises(ValueError, match="dur"):
        _ = ts >= "0.5dur"
    old = {"epoch": 1, "batch": 5, "sample": 40, "token": 0, "batch_in_epoch": 0,
           "sample_in_epoch": 0, "token_in_epoch": 0}  # a checkpoint from before the clocks
    assert Timestamp.from_state_dict(old).batch == 5


def test_timestamp_copy_and_constructor() -> None:
    ts = Timestamp(epoch=2, batch=Time(7, "ba"), total_wct=datetime.timedelta(seconds=3))
    assert ts.epoch == 2 and ts.batch == 7 and ts.total_wct.total_seconds() == 3
    moved = ts.copy(batch=9, sample=Time(4, "sp"))
    assert moved.batch == 9 and moved.sample == 4 and moved.epoch == 2 and ts.batch == 7
    with pytest.raises(ValueError, match="batch"):
        Timestamp(batch=Time(1, "ep"))
    with pytest.raises(TypeError, match="unknown field"):
        ts.copy(batches=3)
    ts.epoch_in_iteration = 3
    assert ts.epoch_in_iteration == Time(3, "ep")
    with pytest.raises(AttributeError):
        ts.batch = 3  # type: ignore[misc]


def test_to_next_batch_is_cheap() -> None:
    """The loop calls it once per step: it must stay a few microseconds."""
    import timeit

    ts = Timestamp()
    per_call = min(timeit.repeat(lambda: ts.to_next_batch(8, 512), number=2000, repeat=3)) / 2000
    assert per_call < 50e-6, f"to_next_batch took {per_call * 1e6:.1f} us"


def test_from_input_of_none_raises_what_composer_and_cadence_catch() -> None:
    from cadence.core.time import Time

    for bad in (None, [123]):
        with pytest.raises(RuntimeError, match="Cannot make a Time from"):
            Time.from_input(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="Cannot make a Time from"):
            Time.from_input(bad)  # type: ignore[arg-type]
