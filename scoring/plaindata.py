"""Plain data: program outputs carried across a process boundary as data, never as objects.

Strict verdicts (SCORING.md D10) compare a program's return values *outside* the program's process,
so nothing the program defined (an ``__eq__``, a ``__repr__``, a metaclass) runs during the
comparison. The program's process encodes each return value with :func:`encode`, which looks only at
exact built-in types (``type(x) is list``, never ``isinstance``) and at the data inside them; the
grader decodes it with :func:`decode`, which builds values only from built-in types, a few trusted
standard-library and numpy types, and synthesized subclasses that carry nothing but the base value.
The same format carries expected outputs measured from canonical solutions (``alodlm-jax-prepare``).

The encoded form is JSON (Python's dialect, which writes ``NaN`` and ``Infinity``):

* ``None``, ``bool``, ``int``, ``float``, ``str`` and ``list`` are themselves;
* every other value is a one-key object: ``{"tuple": [...]}``, ``{"set": [...]}``,
  ``{"frozenset": [...]}``, ``{"dict": [[key, value], ...]}``, ``{"bytes": "<hex>"}``,
  ``{"bytearray": "<hex>"}``, ``{"complex": [re, im]}``, ``{"fraction": [num, den]}``,
  ``{"decimal": "<str>"}``, ``{"numpy": [dtype, value]}`` (a numpy scalar),
  ``{"ndarray": [dtype, shape, nested lists]}``, ``{"ordereddict"|"defaultdict"|"counter":
  [[key, value], ...]}``;
* an instance of a subclass of a built-in type (a ``namedtuple``, an ``IntEnum`` member, a
  ``str`` subclass) is ``{"subclass": [name, <the base value encoded>]}``; it decodes to an
  instance of a synthesized subclass of that base, named like the original, so
  ``type(out) == type(expected)`` fails exactly when it did for the original object while
  equality is the base type's.

Anything else (a function, a generator, an object of the program's own class, a numpy object array,
a structure nested deeper than ``max_depth`` or larger than ``max_items``) raises
:class:`Unrepresentable`: under strict rules that output cannot be compared as data and the test
fails.

The call channel of strict python_tests (:mod:`alodlm_scoring.sandbox.calls`) adds one tag:
``{"handle": n}``, a reference to an object that stays in the program's process. Only
:func:`encode` given ``refer`` writes it (for a value of any type not listed above) and only
:func:`decode` given ``resolve`` reads it; elsewhere it is malformed.
"""

from __future__ import annotations

import collections
import json
import math
import sys
from typing import Any, Callable

__all__ = ["Unrepresentable", "encode", "decode", "dumps", "loads", "MAX_DEPTH", "MAX_ITEMS"]

MAX_DEPTH = 100
MAX_ITEMS = 10_000_000

_SCALARS = (type(None), bool, int, float, str)
_BASES = (bool, int, float, complex, str, bytes, bytearray, tuple, list, dict, set, frozenset)
_DICT_KINDS = {
    collections.OrderedDict: "ordereddict",
    collections.defaultdict: "defaultdict",
    collections.Counter: "counter",
}
_DICT_TYPES = {"ordereddict": collections.OrderedDict, "defaultdict": collections.defaultdict,
               "counter": collections.Counter}


class Unrepresentable(ValueError):
    """A value that cannot travel as plain data."""


class _Budget:
    __slots__ = ("items", "max_items", "max_depth", "handles")

    def __init__(self, max_items: int, max_depth: int, handles: Any = None) -> None:
        self.items = 0
        self.max_items = max_items
        self.max_depth = max_depth
        self.handles = handles  # refer (encoding) or resolve (decoding) a handle, or None

    def spend(self, depth: int, count: int = 1) -> None:
        self.items += count
        if self.items > self.max_items:
            raise Unrepresentable(f"more than {self.max_items} items")
        if depth > self.max_depth:
            raise Unrepresentable(f"nested deeper than {self.max_depth}")


# --------------------------------------------------------------------------------------------
# Encoding (runs in the program's process: exact types only)
# --------------------------------------------------------------------------------------------


def encode(value: Any, *, max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS,
           refer: Callable[[Any], int] | None = None) -> Any:
    """``value`` as JSON-ready plain data; raises :class:`Unrepresentable`. With ``refer``, a
    value of any other type becomes ``{"handle": refer(value)}`` instead (the call channel of
    strict python_tests, :mod:`alodlm_scoring.sandbox.calls`)."""
    return _encode(value, 0, _Budget(max_items, max_depth, refer))


def _pairs(mapping: dict, depth: int, budget: _Budget) -> list:
    return [[_encode(k, depth + 1, budget), _encode(v, depth + 1, budget)]
            for k, v in dict.items(mapping)]


def _encode(value: Any, depth: int, budget: _Budget) -> Any:
    budget.spend(depth)
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list:
        return [_encode(item, depth + 1, budget) for item in list.__iter__(value)]
    if kind is tuple:
        return {"tuple": [_encode(item, depth + 1, budget) for item in tuple.__iter__(value)]}
    if kind is set or kind is frozenset:
        return {kind.__name__: [_encode(item, depth + 1, budget) for item in kind.__iter__(value)]}
    if kind is dict:
        return {"dict": _pairs(value, depth, budget)}
    if kind in _DICT_KINDS:
        return {_DICT_KINDS[kind]: _pairs(value, depth, budget)}
    if kind is bytes or kind is bytearray:
        budget.spend(depth, len(value) // 64)
        return {kind.__name__: bytes(value).hex()}
    if kind is complex:
        return {"complex": [complex.__getattribute__(value, "real"),
                            complex.__getattribute__(value, "imag")]}
    # A Fraction or a Decimal exists only once its module is imported (not imported here: the
    # program process of strict python_tests starts faster without them).
    fractions, decimal = sys.modules.get("fractions"), sys.modules.get("decimal")
    if fractions is not None and kind is fractions.Fraction:
        return {"fraction": [int(value.numerator), int(value.denominator)]}
    if decimal is not None and kind is decimal.Decimal:
        return {"decimal": decimal.Decimal.__str__(value)}
    numpy_form = _encode_numpy(value, kind, depth, budget)
    if numpy_form is not None:
        return numpy_form
    for base in _BASES:
        if issubclass(kind, base) and kind not in _DICT_KINDS:
            return {"subclass": [_type_name(kind), _encode_base(value, base, depth, budget)]}
    if budget.handles is not None:
        return {"handle": budget.handles(value)}
    raise Unrepresentable(f"a value of type {_type_name(kind)}")


def _encode_base(value: Any, base: type, depth: int, budget: _Budget) -> Any:
    """The built-in value inside an instance of a subclass, read with the base type's methods."""
    if base is bool:  # bool cannot be subclassed; kept for completeness
        return bool.__bool__(value)
    if base is int:
        return _encode(int.__index__(value), depth + 1, budget)
    if base is float:
        return _encode(float.__float__(value), depth + 1, budget)
    if base is complex:
        return _encode(complex(complex.__getattribute__(value, "real"),
                               complex.__getattribute__(value, "imag")), depth + 1, budget)
    if base is str:
        return _encode(str.__str__(value), depth + 1, budget)
    if base in (bytes, bytearray):
        return _encode(bytes(memoryview(value)), depth + 1, budget)
    if base is dict:
        return _encode(dict(dict.items(value)), depth + 1, budget)
    return _encode(base(base.__iter__(value)), depth + 1, budget)


def _encode_numpy(value: Any, kind: type, depth: int, budget: _Budget) -> Any:
    module = getattr(kind, "__module__", "") or ""
    if not module.startswith("numpy"):
        return None
    import numpy

    if kind is numpy.ndarray:
        if value.dtype.kind not in "biufc?" or value.dtype.hasobject:
            raise Unrepresentable(f"a numpy array of dtype {value.dtype}")
        budget.spend(depth, int(value.size))
        return {"ndarray": [value.dtype.str, list(value.shape), _plain_numbers(value.tolist())]}
    if isinstance(value, numpy.generic) and type(value).__module__ == "numpy":
        if value.dtype.kind not in "biufc?":
            raise Unrepresentable(f"a numpy scalar of dtype {value.dtype}")
        return {"numpy": [value.dtype.str, _plain_numbers(value.item())]}
    return None


def _plain_numbers(value: Any) -> Any:
    """numpy's ``tolist`` output (nested lists of bool/int/float/complex) as plain data."""
    if type(value) is list:
        return [_plain_numbers(item) for item in value]
    if type(value) is complex:
        return {"complex": [value.real, value.imag]}
    return value


def _type_name(kind: type) -> str:
    module = getattr(kind, "__module__", None)
    name = getattr(kind, "__qualname__", None) or getattr(kind, "__name__", "?")
    return f"{module}.{name}" if module and module != "builtins" else str(name)


# --------------------------------------------------------------------------------------------
# Decoding (runs in the grader: builds only trusted types)
# --------------------------------------------------------------------------------------------

_SYNTHESIZED: dict[tuple[type, str], type] = {}


def _subclass(base: type, name: str) -> type:
    key = (base, name)
    if key not in _SYNTHESIZED:
        short = name.rsplit(".", 1)[-1] or "subclass"
        if not short.isidentifier():
            short = "subclass"
        _SYNTHESIZED[key] = type(short, (base,), {"__module__": "alodlm_scoring.plaindata",
                                                  "__qualname__": name})
    return _SYNTHESIZED[key]


def decode(data: Any, *, max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS,
           resolve: Callable[[int], Any] | None = None) -> Any:
    """The value that :func:`encode` encoded; raises :class:`Unrepresentable` on malformed data.
    ``{"handle": n}`` (a non-negative int) decodes to ``resolve(n)``, and is malformed without
    ``resolve``."""
    return _decode(data, 0, _Budget(max_items, max_depth, resolve))


def _decode(data: Any, depth: int, budget: _Budget) -> Any:
    budget.spend(depth)
    kind = type(data)
    if kind in _SCALARS:
        return data
    if kind is list:
        return [_decode(item, depth + 1, budget) for item in data]
    if kind is not dict or len(data) != 1:
        raise Unrepresentable(f"malformed plain data of type {kind.__name__}")
    (tag, body), = data.items()
    try:
        return _decode_tagged(tag, body, depth, budget)
    except Unrepresentable:
        raise
    except (TypeError, ValueError, ArithmeticError) as error:
        raise Unrepresentable(f"malformed {tag!r} value: {error}") from None


def _decode_tagged(tag: str, body: Any, depth: int, budget: _Budget) -> Any:
    if tag in ("tuple", "set", "frozenset"):
        items = [_decode(item, depth + 1, budget) for item in _list(body)]
        return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    if tag == "dict" or tag in _DICT_TYPES:
        pairs = []
        for pair in _list(body):
            if type(pair) is not list or len(pair) != 2:
                raise Unrepresentable("malformed mapping item")
            pairs.append((_decode(pair[0], depth + 1, budget), _decode(pair[1], depth + 1, budget)))
        mapping = dict(pairs)
        if tag == "dict":
            return mapping
        if tag == "defaultdict":
            return collections.defaultdict(None, mapping)
        return _DICT_TYPES[tag](mapping)
    if tag in ("bytes", "bytearray"):
        if type(body) is not str:
            raise Unrepresentable("malformed bytes")
        budget.spend(depth, len(body) // 128)
        raw = bytes.fromhex(body)
        return raw if tag == "bytes" else bytearray(raw)
    if tag == "complex":
        real, imag = _numbers(body, 2)
        return complex(real, imag)
    if tag == "fraction":
        numerator, denominator = _numbers(body, 2, integers=True)
        import fractions

        return fractions.Fraction(numerator, denominator)
    if tag == "decimal":
        if type(body) is not str:
            raise Unrepresentable("malformed decimal")
        import decimal

        return decimal.Decimal(body)
    if tag == "numpy":
        import numpy

        dtype, value = _list(body, 2)
        dtype = _numeric_dtype(numpy, dtype)
        return dtype.type(_decode_number(value))
    if tag == "ndarray":
        import numpy

        dtype, shape, values = _list(body, 3)
        dtype = _numeric_dtype(numpy, dtype)
        shape = tuple(_numbers(shape, None, integers=True))
        size = math.prod(shape) if shape else 1
        budget.spend(depth, size)
        array = numpy.array(_decode_numbers(values), dtype=dtype)
        if array.shape != shape:
            raise Unrepresentable("ndarray shape does not match its values")
        return array
    if tag == "handle" and budget.handles is not None:
        if type(body) is not int or not 0 <= body < 1 << 31:
            raise Unrepresentable("malformed handle")
        return budget.handles(body)
    if tag == "subclass":
        name, inner = _list(body, 2)
        if type(name) is not str:
            raise Unrepresentable("malformed subclass name")
        value = _decode(inner, depth + 1, budget)
        base = type(value)
        if base not in _BASES or base is bool:
            raise Unrepresentable(f"cannot rebuild a subclass of {base.__name__}")
        return _subclass(base, name)(value)
    raise Unrepresentable(f"unknown plain-data tag {tag!r}")


def _list(body: Any, length: int | None = None) -> list:
    if type(body) is not list or (length is not None and len(body) != length):
        raise Unrepresentable("malformed plain data")
    return body


def _numbers(body: Any, length: int | None, *, integers: bool = False) -> list:
    items = _list(body, length)
    allowed = (int,) if integers else (int, float)
    if not all(type(item) in allowed for item in items):
        raise Unrepresentable("malformed number list")
    return items


def _decode_number(value: Any) -> Any:
    if type(value) in (bool, int, float):
        return value
    if type(value) is dict and list(value) == ["complex"]:
        real, imag = _numbers(value["complex"], 2)
        return complex(real, imag)
    raise Unrepresentable("malformed numpy value")


def _decode_numbers(values: Any) -> Any:
    if type(values) is list:
        return [_decode_numbers(item) for item in values]
    return _decode_number(values)


def _numeric_dtype(numpy, text: Any):
    if type(text) is not str:
        raise Unrepresentable("malformed dtype")
    dtype = numpy.dtype(text)
    if dtype.kind not in "biufc?" or dtype.hasobject:
        raise Unrepresentable(f"dtype {text!r} is not numeric")
    return dtype


# --------------------------------------------------------------------------------------------
# Text form
# --------------------------------------------------------------------------------------------


def dumps(value: Any, **limits: int) -> str:
    """``encode`` then one line of JSON (``NaN``/``Infinity`` allowed, no newline inside)."""
    return json.dumps(encode(value, **limits), separators=(",", ":"))


def loads(text: str | bytes, **limits: int) -> Any:
    """The inverse of :func:`dumps`; malformed text raises :class:`Unrepresentable`."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise Unrepresentable(f"not plain-data JSON: {error}") from None
    return decode(data, **limits)
