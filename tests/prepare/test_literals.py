"""JSON when it round-trips exactly, a Python literal otherwise, an error when neither does."""

from __future__ import annotations

import ast
import math

import pytest

from alodlm_prepare.literals import Unwritable, python_literal, same_value, suite_field


@pytest.mark.parametrize("value", [
    [[1, 2], "a", None, True, 1.5, -0.0],
    [{"key": [1.0, 2]}],
    [float("inf"), -float("inf")],
    [float("nan")],  # NaN has no literal, but JSON carries it
])
def test_json_when_it_round_trips(value):
    key, written = suite_field("expected", value)
    assert key == "expected" and written is value


@pytest.mark.parametrize("value", [
    [(1, 2)], [(1,)], [()], [{1, 2}], [set()], [{1: "a"}], [{(1, 2): [3]}],
    [complex(1.5, -2.0)], [b"\x00x"], [[(float("inf"), -float("inf"))]], [(True, 1, 1.0)],
])
def test_literal_when_json_would_change_the_value(value):
    key, text = suite_field("inputs", value)
    assert key == "inputs_literal"
    assert same_value(ast.literal_eval(text), value)


@pytest.mark.parametrize("value", [[(float("nan"),)], [frozenset({1})], [{1: float("nan")}]])
def test_neither_form_is_an_error(value):
    with pytest.raises(Unwritable, match="neither JSON nor a Python literal"):
        suite_field("expected", value)


def test_infinity_literal_is_a_number_not_a_name():
    assert python_literal(float("inf")) == "1e309"
    assert ast.literal_eval(python_literal([-float("inf")])) == [-math.inf]
    with pytest.raises(Unwritable):
        python_literal(float("nan"))


def test_same_value_is_type_exact():
    assert not same_value([1], [1.0])
    assert not same_value([(1,)], [[1]])
    assert not same_value([True], [1])
    assert same_value([float("nan")], [float("nan")])
    assert same_value([{3, 1, 2}], [{1, 2, 3}])
    assert not same_value([-0.0], [0.0])
