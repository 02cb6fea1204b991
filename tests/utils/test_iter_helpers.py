"""``cadence.utils.ensure_tuple`` (Composer's docs fixtures import it from ``composer.utils``)."""

from cadence.utils import ensure_tuple
from cadence.utils.iter_helpers import ensure_tuple as from_module


def test_ensure_tuple_follows_composer():
    assert from_module is ensure_tuple
    assert ensure_tuple(None) == ()
    assert ensure_tuple("ab") == ("ab",)
    assert ensure_tuple(b"ab") == (b"ab",)
    same = (1, 2)
    assert ensure_tuple(same) is same
    assert ensure_tuple([1, [2]]) == (1, [2])
    assert ensure_tuple({"a": 1, "b": 2}) == (1, 2)
    assert ensure_tuple(3) == (3,)
