"""Plain data (``alodlm_scoring.plaindata``): exact types round-trip, anything else is refused or,
on strict python_tests' call channel, becomes a handle."""

from __future__ import annotations

import collections
import decimal
import fractions

import pytest

from alodlm_scoring import plaindata

VALUES = [None, True, 3, -2.5, float("inf"), "s", [1, [2]], (1, "a"), {1, 2}, frozenset({3}),
          {"k": (1, {2})}, b"\x00\xff", bytearray(b"ab"), 1 + 2j, fractions.Fraction(1, 3),
          decimal.Decimal("1.50"), collections.Counter("aab"), collections.OrderedDict(a=1),
          7 ** 3000]


@pytest.mark.parametrize("value", VALUES, ids=[type(v).__name__ for v in VALUES])
def test_values_round_trip_with_their_types(value):
    back = plaindata.loads(plaindata.dumps(value))
    assert back == value and type(back) is type(value)


def test_objects_are_unrepresentable_or_handles_when_asked():
    class Mine:
        pass

    mine, gen = Mine(), (i for i in range(2))
    with pytest.raises(plaindata.Unrepresentable):
        plaindata.encode([mine])
    refs = {}
    encoded = plaindata.encode([mine, (gen, 1), mine], refer=lambda v: refs.setdefault(id(v), len(refs)))
    assert encoded == [{"handle": 0}, {"tuple": [{"handle": 1}, 1]}, {"handle": 0}]
    assert plaindata.decode(encoded, resolve=lambda ref: f"h{ref}") == ["h0", ("h1", 1), "h0"]


@pytest.mark.parametrize("data", [{"handle": 0}, {"handle": -1}, {"handle": "0"}, {"handle": 2**31},
                                  {"fraction": [1, 0]}, {"decimal": "x"}, {"tuple": 3}])
def test_malformed_data_is_refused(data):
    resolve = (lambda ref: ref) if data != {"handle": 0} else None
    with pytest.raises(plaindata.Unrepresentable):
        plaindata.decode(data, resolve=resolve)


def test_depth_and_size_are_bounded():
    deep = []
    for _ in range(plaindata.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(plaindata.Unrepresentable):
        plaindata.encode(deep)
    with pytest.raises(plaindata.Unrepresentable):
        plaindata.decode(plaindata.encode(deep, max_depth=1000))
    with pytest.raises(plaindata.Unrepresentable):
        plaindata.encode(list(range(100)), max_items=50)
