from __future__ import annotations

import pytest

from cadence import Time, Timestamp, TimeUnit


@pytest.mark.parametrize(
    ("text", "value", "unit"),
    [("2ep", 2, TimeUnit.EPOCH), ("100ba", 100, TimeUnit.BATCH), ("4096sp", 4096, TimeUnit.SAMPLE),
     ("1e6tok", 1_000_000, TimeUnit.TOKEN), ("0.5dur", 0.5, TimeUnit.DURATION),
     (" 3 ba ", 3, TimeUnit.BATCH)],
)
def test_parse(text: str, value: float, unit: TimeUnit) -> None:
    t = Time.from_timestring(text)
    assert t.value == value and t.unit == unit
    assert isinstance(t.value, float if unit == TimeUnit.DURATION else int)


@pytest.mark.parametrize("text", ["2epochs", "ba", "10", "-1ba", "1.5ep", "abc", "2 e p"])
def test_bad_strings_name_the_string_and_units(text: str) -> None:
    with pytest.raises(ValueError) as info:
        Time.from_timestring(text)
    message = str(info.value)
    assert repr(text) in message
    if text not in ("1.5ep",):
        assert "'ep'" in message and "'tok'" in message and "'dur'" in message


def test_fraction_only_for_dur() -> None:
    with pytest.raises(ValueError, match="whole number"):
        Time.from_timestring("1.5ep")
    with pytest.raises(ValueError, match="whole number"):
        Time(2.5, TimeUnit.BATCH)


def test_arithmetic_and_comparison() -> None:
    a, b = Time.from_timestring("10ba"), Time(4, "ba")
    assert a + b == Time(14, TimeUnit.BATCH)
    assert a - b == "6ba"
    assert a * 3 == "30ba"
    assert a / b == 2.5
    assert a + 1 == "11ba"
    assert b < a and a > "9ba" and a >= "10ba" and a <= "10ba"
    assert a != Time(10, TimeUnit.EPOCH)  # different units are never equal
    with pytest.raises(ValueError, match="units differ"):
        _ = a < Time(1, TimeUnit.EPOCH)
    with pytest.raises(ValueError, match="units differ"):
        _ = a + "1ep"
    assert str(Time.from_timestring("1e6tok")) == "1000000tok"
    assert str(Time.from_timestring("0.25dur")) == "0.25dur"


def test_from_input() -> None:
    assert Time.from_input(3, TimeUnit.EPOCH) == "3ep"
    with pytest.raises(ValueError, match="has no unit"):
        Time.from_input(3)
    with pytest.raises(TypeError):
        Time.from_input([3])  # type: ignore[arg-type]


def test_timestamp_compares_with_strings() -> None:
    ts = Timestamp()
    for _ in range(5):
        ts = ts.to_next_batch(samples=8, tokens=8 * 64)
    ts = ts.to_next_epoch()
    assert ts >= "5ba" and ts < "6ba" and ts > "39sp" and ts <= "40sp"
    assert ts >= "2560tok" and ts == Timestamp.from_state_dict(ts.state_dict())
    assert ts >= "1ep" and ts.batch_in_epoch == 0 and ts.batch == 5
    with pytest.raises(ValueError, match="dur"):
        _ = ts >= "0.5dur"
