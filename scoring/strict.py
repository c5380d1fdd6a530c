"""Strict verdict rules for code metrics (SCORING.md D10), the parts that need no sandbox.

``--code_verdicts=strict`` accepts only passes the program cannot have arranged:

* **python_tests**: the tests run where the program cannot reach them. The worker checks that
  ``check.py``'s last statements are exactly the test program's (a program that swallows them
  into an unclosed string or block fails) and that the program's text alone is the rest
  (:func:`tests_intact`); then the program runs in one sandboxed process and the tests in
  another, calling the program's functions remotely with plain data
  (:mod:`alodlm_scoring.sandbox.calls`). The verdict is the test process's exit status: no
  ``__eq__``, frame, file, memory or exit of the program's can make it 0.
* **evalplus**: the program's process never receives the expected outputs; it returns each
  output as plain data (:mod:`alodlm_scoring.plaindata`) and :func:`evalplus_passes` compares
  them here, with evalplus 0.3.1's rules (exact match, its special oracles, its float
  tolerance), so no ``__eq__`` of the program's objects is ever called; a value that is not
  plain data arrives as :data:`OPAQUE` (not None, not a bool, equal to nothing else). For HumanEval's
  ``find_zero`` the residual of the returned root is computed here too, against the task's own
  (unmodified) coefficients.

Honest programs get the reference's verdicts under these rules; docs/scoring.md ("Strict verdict
rules") lists where they differ and why (objects that cannot cross as plain data).
"""

from __future__ import annotations

import ast
from typing import Any, Sequence

__all__ = ["tests_intact", "future_flags", "evalplus_passes", "root_residual_outputs", "Output", "OPAQUE"]

# (True, value) for a returned value; (False, reason) for a timeout or an exception.
Output = tuple


class _Opaque:
    """A returned value that is not plain data (a regex match, a generator, an object of the
    program's own class). It is not None and not a bool, and equals nothing but itself, which
    is all evalplus's rules can observe of such a value without calling its methods (MBPP's
    "output is not None" tasks return regex matches)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<opaque value>"


OPAQUE = _Opaque()


def tests_intact(program: str, tests: str) -> bool:
    """Whether ``check.py`` (program, blank line, tests) parses into the program's own
    statements followed by exactly the test program's statements, so that running the two
    apart runs what ``check.py`` would."""
    try:
        combined = ast.parse(program + "\n\n" + tests + "\n")
        alone = ast.parse(tests + "\n")
        own = ast.parse(program + "\n")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if len(combined.body) != len(own.body) + len(alone.body):
        return False
    dump = ast.dump
    return all(dump(mine) == dump(theirs)
               for mine, theirs in zip(combined.body, own.body + alone.body))


def future_flags(program: str) -> int:
    """The compiler flags of the program's ``from __future__`` imports, which in ``check.py``
    apply to the tests too (0 when the program does not parse)."""
    import __future__

    try:
        body = ast.parse(program + "\n").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return 0
    flags = 0
    for statement in body:
        if not (isinstance(statement, ast.ImportFrom) and statement.module == "__future__"):
            if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                continue  # a docstring may come first
            break
        for alias in statement.names:
            feature = getattr(__future__, alias.name, None)
            flags |= getattr(feature, "compiler_flag", 0)
    return flags


def root_residual_outputs(inputs: Sequence[Sequence[Any]], outputs: Sequence[Output],
                          atol: float) -> list[Output]:
    """HumanEval ``find_zero``: each returned root becomes ``|poly(xs, root)| <= atol``, the
    value the reference's residual wrapper returns (an exception fails that input)."""
    from evalplus.eval._special_oracle import _poly

    checked: list[Output] = []
    for arguments, (ok, root) in zip(inputs, outputs):
        if not ok:
            checked.append((False, root))
            continue
        try:
            checked.append((True, abs(_poly(*arguments, root)) <= atol))
        except Exception:  # noqa: BLE001 - as the wrapper raising in the program's process
            checked.append((False, "exception"))
    return checked


def evalplus_passes(dataset: str, entry_point: str, inputs: Sequence[Sequence[Any]],
                    outputs: Sequence[Output], expected: Sequence[Any], atol: float) -> bool:
    """evalplus 0.3.1's per-input comparison (``unsafe_execute``) on plain-data outputs.

    A suite passes when every input has an output that matches; the first mismatch decides.
    """
    import numpy as np
    from evalplus.eval import is_floats
    from evalplus.eval._special_oracle import (MBPP_OUTPUT_NOT_NONE_TASKS,
                                                MBPP_OUTPUT_SET_EQ_TASKS, _digit_distance_nums,
                                                _surface_Area)

    if len(outputs) != len(inputs):
        return False
    for index, arguments in enumerate(inputs):
        ok, out = outputs[index]
        if not ok:
            return False
        try:
            exp = expected[index]
            exact_match = out == exp
            if dataset == "mbpp":
                if entry_point == "are_equivalent":
                    exact_match = True
                elif entry_point == "sum_div":
                    exact_match = exact_match or out == 0
                elif entry_point == "surface_Area":
                    exact_match = exact_match or abs(out - _surface_Area(*arguments)) <= atol
                elif entry_point == "digit_distance_nums":
                    exact_match = exact_match or out == _digit_distance_nums(*arguments)
                elif entry_point in MBPP_OUTPUT_SET_EQ_TASKS:
                    exact_match = set(out) == set(exp)
                elif entry_point in MBPP_OUTPUT_NOT_NONE_TASKS:
                    exact_match = out == exp if isinstance(out, bool) else exp == (out is not None)
            if atol == 0 and is_floats(exp):
                atol = 1e-6
            if not exact_match and atol != 0:
                if type(out) != type(exp):  # noqa: E721 - evalplus compares types exactly
                    return False
                if isinstance(exp, (list, tuple)) and len(out) != len(exp):
                    return False
                if not np.allclose(out, exp, rtol=1e-07, atol=atol):
                    return False
            elif not exact_match:
                return False
        except Exception:  # noqa: BLE001 - evalplus counts any exception as a failed input
            return False
    return True
