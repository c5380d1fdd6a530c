"""The scoring dispatcher and the metric implementations (SCORING.md §3, §4.5-§4.6, §5.2-§5.4).

``score(record, generation)`` returns ``(correct, extracted)`` exactly as the reference scorer
does (decision D1). Code metrics execute generated programs in child processes started from the
*current* process; the evaluator never calls them directly but through ``alodlm_scoring.pool``,
which runs :func:`score` in a fresh interpreter (D6).

math-verify and evalplus are imported lazily: loading tasks or scoring multiple choice must not pay
for (or depend on) them, and this module must never pull in a deep-learning framework.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any

from . import extract, sandboxed, validation
from .tasks import CODE_METRICS, SUPPORTED_METRICS
from .validation import (DEFAULT_CODE_TIMEOUT_SECONDS, DEFAULT_MIN_TIME_LIMIT,  # noqa: F401
                         DEFAULT_OPTIONS, DEFAULT_TIME_LIMIT_FACTOR, EVALPLUS_DATASETS,
                         MMLU_PRO_OPTIONS)  # defined with the checks; still importable from here

__all__ = [
    "METRICS",
    "CODE_METRICS",
    "score",
    "math_correct",
    "math_verify_equal",
    "normalized_equal",
    "run_python_tests",
    "run_evalplus",
]

METRICS = SUPPORTED_METRICS
# Address-space cap for python_tests programs, as evalplus's reliability guard uses by default.
CHILD_ADDRESS_SPACE_BYTES = 4 * 1024**3

# arc is not here: its extractor also needs the option labels.
_LETTER_EXTRACTORS = {
    "mmlu": extract.extract_mmlu,
    "gpqa": extract.extract_gpqa,
    "mmlu_pro": extract.extract_mmlu_pro,
}


# --------------------------------------------------------------------------------------------
# Dispatcher
# --------------------------------------------------------------------------------------------


def score(record: dict, generation: str, *, rules: str = "reference",
          sandbox: Any = None) -> tuple[bool, str | None]:
    """Score one generation against its task record: ``(correct, extracted)``.

    ``extracted`` is ``None`` for code metrics. Raises the reference's validation errors (§2.3),
    defined in :mod:`alodlm_scoring.validation` (which ``load_tasks`` runs on every task up front).
    Code metrics run their program in ``sandbox`` (an :class:`alodlm_scoring.sandbox.Sandbox`;
    the scoring workers pass theirs) or, without one, in plain child processes of this process
    (the reference's way: no containment). ``rules`` is ``"reference"`` (the reference's
    verdicts) or ``"strict"`` (:mod:`alodlm_scoring.strict`; needs a sandbox). For untrusted
    code from a process that may have JAX loaded, use :class:`alodlm_scoring.Scorer`.
    """
    metric = record["metric"]
    if metric not in METRICS:
        raise ValueError(f"Unsupported evaluation metric: {metric!r}")
    reference = validation.reference_answer(record)
    if metric in CODE_METRICS:
        _check_rules(rules, sandbox)
        program = extract.extract_program(generation, validation.function_prefix(record))
        if metric == "python_tests":
            return bool(_run_python_tests_record(record, program, rules, sandbox)), None
        return bool(run_evalplus(record, program, rules=rules, sandbox=sandbox)), None
    if not reference:
        raise ValueError("An evaluation reference is required")
    if metric == "exact":
        extracted = generation.strip()
        return extracted == reference, extracted
    if metric == "math":
        prediction = extract.extract_math_prediction(generation)
        gold = extract.extract_math_gold(reference)
        return math_correct(gold, prediction), prediction
    return _score_multiple_choice(metric, record, reference, generation)


def _check_rules(rules: str, sandbox: Any) -> None:
    if rules not in sandboxed.RULE_SETS:
        raise ValueError(f"code verdict rules must be reference or strict, got {rules!r}")
    if rules == "strict" and sandbox is None:
        raise ValueError("strict code verdicts need the code sandbox")


def _score_multiple_choice(metric: str, record: dict, reference: str, generation: str):
    options = validation.option_labels(record, metric)
    validation.check_gold_label(reference, options)
    if metric == "arc":
        extracted = extract.extract_arc(generation, options)
    else:
        extracted = _LETTER_EXTRACTORS[metric](generation)
    return extracted.upper() == reference.upper(), extracted


# --------------------------------------------------------------------------------------------
# Math
# --------------------------------------------------------------------------------------------


def math_verify_equal(gold: str, prediction: str) -> bool:
    """math-verify 0.8.0 with default settings, gold first; any exception means "not equal".

    math-verify's timeouts use SIGALRM, which only works on the main thread; elsewhere it raises,
    which would silently turn every comparison into "not equal". Refuse loudly instead.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("math scoring must run on the main thread (math-verify uses SIGALRM)")
    try:
        from math_verify import parse, verify

        return bool(verify(parse(f"${gold}$"), parse(f"${prediction}$")))
    except Exception:
        return False


def normalized_equal(gold: str, prediction: str) -> bool:
    """Equality after the legacy normalizer (§4.6.6) on both sides."""
    return extract.legacy_normalize(prediction) == extract.legacy_normalize(gold)


def math_correct(gold: str, prediction: str) -> bool:
    """§4.6.3: an empty side is incorrect; else math-verify equivalence OR normalized equality."""
    if not prediction or not gold:
        return False
    return math_verify_equal(gold, prediction) or normalized_equal(gold, prediction)


# --------------------------------------------------------------------------------------------
# python_tests (MBPP)
# --------------------------------------------------------------------------------------------


def _physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _address_space_limit() -> int:
    physical = _physical_memory_bytes()
    return CHILD_ADDRESS_SPACE_BYTES if not physical else min(CHILD_ADDRESS_SPACE_BYTES, physical)


def _limit_child_address_space(limit: int) -> None:
    """Runs in the child before exec: cap its address space (never raise the hard limit)."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):
        pass


def _kill_process_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_python_tests(program: str, tests: str, timeout: float) -> bool:
    """Run ``program`` followed by ``tests`` in a fresh isolated interpreter (§5.2).

    Passes iff the interpreter exits with status 0 within ``timeout`` wall-clock seconds. The child
    leads its own session, so on timeout the whole process group (grandchildren included) is
    killed; its address space is capped like evalplus's default (4 GiB, at most physical RAM).
    """
    limit = _address_space_limit()
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as directory:
        with open(os.path.join(directory, "check.py"), "w") as handle:
            handle.write(program + "\n\n" + tests + "\n")
        process = subprocess.Popen(
            [sys.executable, "-I", "check.py"],
            cwd=directory,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=lambda: _limit_child_address_space(limit),
        )
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_process_group(process)
            process.wait()
            return False
        finally:
            # Reap stragglers (a program may leave background grandchildren behind).
            _kill_process_group(process)
        return returncode == 0


def _run_python_tests_record(record: dict, program: str, rules: str = "reference",
                             sandbox: Any = None) -> bool:
    tests, timeout = validation.python_tests_arguments(record)
    if sandbox is None:
        return run_python_tests(program, tests, timeout)
    from . import sandboxed

    return sandboxed.python_tests(sandbox, program, tests, timeout, rules=rules)


# --------------------------------------------------------------------------------------------
# evalplus (HumanEval, HumanEval+, MBPP+)
# --------------------------------------------------------------------------------------------

_IDENTITY_PROGRAM = "def identity(x):\n    return {}\n"
_ROOT_CHECK_ENTRY = "_alodlm_root_check"
# The (sandbox, rules) combinations whose grader passed its self-check (None: no sandbox).
_GRADERS_CHECKED: set = set()


def _untrusted_check(*args, **kwargs):
    from evalplus.eval import untrusted_check

    return untrusted_check(*args, **kwargs)


def _ensure_grader_works(sandbox: Any = None, rules: str = "reference") -> None:
    """Once per process (and per sandbox and rule set): the grader must pass a correct and fail
    a wrong identity function, through the same path the tasks take."""
    key = (id(sandbox) if sandbox is not None else None, rules)
    if key in _GRADERS_CHECKED:
        return
    if sys.platform == "darwin":
        os.environ.setdefault("EVALPLUS_MAX_MEMORY_BYTES", "-1")
    statuses = [
        "pass" if _suite_passes(sandbox, rules, "humaneval", _IDENTITY_PROGRAM.format(body),
                                "identity", [[3]], [3], 0, [0.001], DEFAULT_MIN_TIME_LIMIT,
                                DEFAULT_TIME_LIMIT_FACTOR, root_check=False) else "fail"
        for body in ("x", "0")
    ]
    if statuses != ["pass", "fail"]:
        raise RuntimeError(
            f"Code grader failed its positive/negative execution checks (got {statuses!r})"
        )
    _GRADERS_CHECKED.add(key)


def _root_check_program(program: str, atol: float) -> str:
    """Append the residual wrapper for HumanEval ``find_zero`` (§5.3 step 3)."""
    return (
        program
        + "\n\n"
        + "from evalplus.eval._special_oracle import _poly as _alodlm_poly\n\n\n"
        + f"def {_ROOT_CHECK_ENTRY}(*args):\n"
        + "    root = find_zero(*args)\n"
        + f"    return abs(_alodlm_poly(*args, root)) <= {atol!r}\n"
    )


def _resolve(suite: dict, key: str) -> Any:
    return validation.resolve(suite, key)


def _suite_arguments(suite: dict, root_check: bool) -> tuple[list, list, list]:
    """Inputs, expected outputs and reference times of one suite, validated (§2.3)."""
    return validation.suite_arguments(suite, root_check)


def run_evalplus(record: dict, program: str, *, rules: str = "reference",
                 sandbox: Any = None) -> bool:
    """Score ``program`` with evalplus 0.3.1 over the record's suites, in order (§5.3).

    The first suite that does not pass ends scoring with False; later suites are neither
    validated nor run. ``rules`` and ``sandbox`` as in :func:`score`.
    """
    _check_rules(rules, sandbox)
    _ensure_grader_works(sandbox, rules)
    settings = validation.evalplus_settings(record)
    dataset, suites, atol, entry_point, min_time_limit, time_limit_factor = settings
    root_check = validation.is_root_check(settings)
    for suite in suites:
        inputs, expected, times = _suite_arguments(suite, root_check)
        if not _suite_passes(sandbox, rules, dataset, program, entry_point, inputs, expected,
                             atol, times, min_time_limit, time_limit_factor, root_check):
            return False
    return True


def _suite_passes(sandbox: Any, rules: str, dataset: str, program: str, entry_point: str,
                  inputs: list, expected: list, atol: float, times: list, min_time_limit: float,
                  time_limit_factor: float, root_check: bool) -> bool:
    """One suite: evalplus's ``untrusted_check`` (reference rules: here without a sandbox, or in
    it), or the program's outputs compared as plain data (strict rules)."""
    if rules == "strict":
        from . import sandboxed, strict

        outputs = sandboxed.evalplus_outputs(
            sandbox, program=program, entry_point=entry_point, inputs=inputs,
            time_limits=sandboxed.time_limits(times, min_time_limit, time_limit_factor))
        if outputs is None:
            return False
        if root_check:
            outputs = strict.root_residual_outputs(inputs, outputs, atol)
            entry_point = _ROOT_CHECK_ENTRY
        return strict.evalplus_passes(dataset, entry_point, inputs, outputs, expected, atol)
    if root_check:
        program = _root_check_program(program, atol)
        entry_point = _ROOT_CHECK_ENTRY
    if sandbox is None:
        status, _ = _untrusted_check(dataset, program, inputs, entry_point, expected, atol, times,
                                     min_time_limit=min_time_limit,
                                     gt_time_limit_factor=time_limit_factor)
        return status == "pass"
    from . import sandboxed

    return sandboxed.evalplus_status(
        sandbox, dataset=dataset, program=program, inputs=inputs, entry_point=entry_point,
        expected=expected, atol=atol, reference_seconds=times, min_time_limit=min_time_limit,
        time_limit_factor=time_limit_factor) == "pass"
