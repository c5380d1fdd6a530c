"""JSON or Python literal: how an EvalPlus suite carries its inputs and expected outputs.

A suite field is written as JSON (``inputs``, ``expected``) when JSON gives back exactly the same
value, and as Python literal text (``inputs_literal``, ``expected_literal``, read by the scorer with
``ast.literal_eval``) when it does not: tuples, sets, dicts with non-string keys, complex numbers
and bytes need the literal. NaN has no literal (``float('nan')`` is a call) but JSON carries it;
infinity is written ``1e309``, which ``literal_eval`` reads back as ``inf``. A value that neither
form reproduces exactly (a frozenset, a numpy scalar, a named tuple) is an error.

"Exactly the same" is decided by :func:`same_value`: equal after :func:`alodlm_scoring.plaindata.
encode`, which sees exact types (``1`` is not ``1.0``, a tuple is not a list, NaN equals NaN), with
the members of sets compared in a canonical order.
"""

from __future__ import annotations

import ast
import json
import math
from typing import Any

from alodlm_scoring import plaindata

__all__ = ["Unwritable", "python_literal", "same_value", "suite_field"]


class Unwritable(ValueError):
    """A value that has no exact Python literal, or that no encoding carries exactly."""


def _canonical(encoded: Any) -> Any:
    if isinstance(encoded, list):
        return [_canonical(item) for item in encoded]
    if isinstance(encoded, dict):
        (tag, body), = encoded.items()
        if tag in ("set", "frozenset"):
            return {tag: sorted((_canonical(item) for item in body), key=json.dumps)}
        return {tag: _canonical(body)}
    return encoded


def same_value(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same plain data: same exact types, same values."""
    try:
        left, right = plaindata.encode(a), plaindata.encode(b)
    except plaindata.Unrepresentable:
        return False
    return json.dumps(_canonical(left)) == json.dumps(_canonical(right))


def _float(value: float) -> str:
    if math.isnan(value):
        raise Unwritable("NaN has no Python literal")
    if math.isinf(value):
        return "1e309" if value > 0 else "-1e309"
    return repr(value)


def python_literal(value: Any) -> str:
    """Python literal text for ``value`` (exact built-in types only); raises :class:`Unwritable`.

    The text is not checked here; :func:`suite_field` reads it back before using it.
    """
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str or kind is bytes:
        return repr(value)
    if kind is float:
        return _float(value)
    if kind is complex:
        imag = value.imag
        sign = "-" if math.copysign(1.0, imag) < 0 else "+"
        return f"({_float(value.real)}{sign}{_float(abs(imag))}j)"
    if kind is list:
        return "[" + ", ".join(python_literal(item) for item in value) + "]"
    if kind is tuple:
        items = [python_literal(item) for item in value]
        return "(" + items[0] + ",)" if len(items) == 1 else "(" + ", ".join(items) + ")"
    if kind is set:
        if not value:
            return "set()"
        return "{" + ", ".join(python_literal(item) for item in value) + "}"
    if kind is dict:
        return "{" + ", ".join(f"{python_literal(k)}: {python_literal(v)}"
                               for k, v in value.items()) + "}"
    raise Unwritable(f"a value of type {kind.__module__}.{kind.__qualname__} has no Python literal")


def _json_text(value: Any) -> str | None:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return None
    return text if same_value(json.loads(text), value) else None


def suite_field(name: str, value: list) -> tuple[str, Any]:
    """``(key, value)`` for a suite's ``inputs`` or ``expected`` list: ``(name, value)`` when JSON
    carries it exactly, else ``(name + "_literal", text)``; raises :class:`Unwritable`."""
    if _json_text(value) is not None:
        return name, value
    try:
        text = python_literal(value)
        readable = same_value(ast.literal_eval(text), value)
    except (Unwritable, ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as error:
        raise Unwritable(f"neither JSON nor a Python literal carries the {name} exactly "
                         f"({error})") from None
    if not readable:
        raise Unwritable(f"neither JSON nor a Python literal carries the {name} exactly")
    return name + "_literal", text
