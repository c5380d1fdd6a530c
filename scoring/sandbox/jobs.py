"""Jobs: functions that run in a sandboxed program process (a fork of the zygote, no ``exec``).

Each job is ``job(payload, context)`` and writes its result as JSON lines to
``context.result_fd``; the worker reads them. The zygote imports this module (and so evalplus
and numpy) before it forks anything, so a job never needs to read the project's own files: the
sandbox lets programs read only the Python installation and the system's libraries.

* ``probe``: writes ``ok`` (the zygote's first run, which finds the mechanisms that work).
* ``evalplus_check``: evalplus 0.3.1's ``untrusted_check`` exactly as the reference calls it
  (reference rules). evalplus forks the checker that executes the program; that child closes
  the result descriptor and enters a nested Landlock domain first (``os.register_at_fork``), so
  the program can neither write this job's verdict nor signal or trace this process.
* ``evalplus_outputs``: strict rules. The program is executed the way evalplus executes it
  (temporary directory, ``reliability_guard``, ``swallow_io``, ``time_limit`` per input), but
  the job never receives the expected outputs: it writes each return value as plain data
  (:mod:`alodlm_scoring.plaindata`) and the worker compares them.
* ``groundtruth``: evalplus's ``trusted_exec`` on a canonical solution (expected outputs and
  reference timings for ``alodlm-jax-prepare``).
* ``python_tests``: strict rules. The test process of a python_tests run: the task's test program
  with the program's names as handles on the run's server, the program process
  (:mod:`alodlm_scoring.sandbox.calls`); its exit status is the verdict.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from evalplus.eval import query_maximum_memory_bytes, untrusted_check
from evalplus.eval.utils import TimeoutException, create_tempdir, reliability_guard, swallow_io, time_limit
from evalplus.gen.util import trusted_exec

from .. import plaindata
from . import calls
from .program import nested_landlock
from .records import JobContext

__all__ = ["JOBS"]


def _line(fd: int, text: str) -> None:
    data = (text + "\n").encode("utf-8", "surrogatepass")
    while data:
        data = data[os.write(fd, data):]


def probe(payload: Any, context: JobContext) -> None:
    _line(context.result_fd, json.dumps({"probe": "ok"}))


def evalplus_check(payload: dict, context: JobContext) -> None:
    """One ``untrusted_check`` call; writes ``{"status": ...}``."""
    result_fd = context.result_fd

    def isolate_checker() -> None:  # in evalplus's forked checker, before the program runs
        os.close(result_fd)
        nested_landlock(context)

    os.register_at_fork(after_in_child=isolate_checker)
    status, _ = untrusted_check(
        payload["dataset"], payload["program"], payload["inputs"], payload["entry_point"],
        payload["expected"], payload["atol"], payload["reference_seconds"],
        min_time_limit=payload["min_time_limit"],
        gt_time_limit_factor=payload["time_limit_factor"],
    )
    _line(result_fd, json.dumps({"status": status}))


def evalplus_outputs(payload: dict, context: JobContext) -> None:
    """Strict rules: execute as evalplus does, write ``{"i": i, "out": <plain data>}``,
    ``{"i": i, "opaque": true}`` (a value that is not plain data, such as a regex match) or
    ``{"i": i, "error": "timeout" | "exception"}`` per input, then ``{"done": true}``;
    ``{"setup": "failed"}`` when the program or its entry point fails."""
    write_line = _line
    dumps = plaindata.dumps
    fd = context.result_fd
    inputs, time_limits = payload["inputs"], payload["time_limits"]
    with create_tempdir():
        # As evalplus's unsafe_execute: the guard disables these, the temporary directory's
        # clean-up needs them back.
        rmtree, rmdir, chdir = shutil.rmtree, os.rmdir, os.chdir
        reliability_guard(maximum_memory_bytes=query_maximum_memory_bytes())
        namespace: dict = {}
        try:
            with swallow_io():
                exec(payload["program"], namespace)
                function = namespace[payload["entry_point"]]
        except BaseException:  # noqa: BLE001 - the program's failure is a failed suite
            write_line(fd, '{"setup": "failed"}')
            os._exit(0)
        for index, arguments in enumerate(inputs):
            try:
                with time_limit(time_limits[index]):
                    with swallow_io():
                        output = function(*arguments)
            except TimeoutException:
                write_line(fd, f'{{"i": {index}, "error": "timeout"}}')
                continue
            except BaseException:  # noqa: BLE001
                write_line(fd, f'{{"i": {index}, "error": "exception"}}')
                continue
            try:
                encoded = dumps(output)
            except BaseException:  # noqa: BLE001 - Unrepresentable, or the program's sabotage
                write_line(fd, f'{{"i": {index}, "opaque": true}}')
                continue
            write_line(fd, f'{{"i": {index}, "out": {encoded}}}')
        write_line(fd, '{"done": true}')
        shutil.rmtree, os.rmdir, os.chdir = rmtree, rmdir, chdir


def groundtruth_reply(payload: dict) -> dict:
    """evalplus's ``trusted_exec`` with timing: ``{"outputs": [...], "seconds": [...]}``
    (outputs as plain data) or ``{"error": "<exception>"}``."""
    try:
        outputs, seconds = trusted_exec(payload["program"], payload["inputs"],
                                        payload["entry_point"], record_time=True,
                                        output_not_none=payload["output_not_none"])
        encoded = [plaindata.encode(output) for output in outputs]
    except BaseException as error:  # noqa: BLE001 - reported to the caller by name
        return {"error": f"{type(error).__name__}: {error}"}
    return {"outputs": encoded, "seconds": seconds}


def groundtruth(payload: dict, context: JobContext) -> None:
    """:func:`groundtruth_reply` on the result pipe."""
    _line(context.result_fd, json.dumps(groundtruth_reply(payload)))


def python_tests(payload: dict, context: JobContext) -> None:
    """:func:`calls.run_tests` (it never returns: the exit status is the verdict)."""
    calls.run_tests(payload["tests"], context.channel_fd, context.read_paths,
                    flags=payload["flags"])


JOBS = {
    "probe": probe,
    "evalplus_check": evalplus_check,
    "evalplus_outputs": evalplus_outputs,
    "groundtruth": groundtruth,
    "python_tests": python_tests,
}
