"""Strict python_tests: the test program runs in its own process and calls the program remotely.

Under the strict rules (SCORING.md D10) a python_tests run is two sandboxed processes of one run
(:class:`alodlm_scoring.sandbox.process.Host` starts both, with one socket pair between them, and
kills both at the end):

* the **program process** executes ``python -I -c`` :func:`server_command`'s text: the model's
  program runs as ``__main__`` (:mod:`.program_server`), then its process answers calls;
* the **test process** (a fork of the sandbox's zygote running job ``python_tests``, which calls
  :func:`run_tests`) executes the task's test program in a fresh ``__main__`` namespace in which
  every top-level name of the program is already bound: a name whose value is plain data
  (:mod:`alodlm_scoring.plaindata`: exact built-in types) to a copy of that value, a module to the
  same module imported by the test process itself, and anything else (a function, a class, an
  object) to a :class:`Handle`. A program name that is also a name of ``builtins`` (a
  program's own ``set`` or ``len``) is left out: the test program's builtins are its own.

A handle stands for an object that stays in the program's process. Calling it, reading one of
its (non-special) attributes, iterating it, ``len``, ``bool``, ``str``, ``repr``, ``[key]`` and
``in`` are requests on the channel: the arguments go as plain data (handles as references), the
answer comes back as plain data or as another handle, or as an exception: an exception class of
the standard ``builtins`` that derives from ``Exception`` is raised as itself, any other (the
program's own classes, ``SystemExit``) as :class:`ProgramError`. So the test process never runs
anything the program defined and never holds an object of the program's: a handle equals only
itself (``==`` is never forwarded), so ``candidate(x) == y`` compares plain data with the test's
own ``==`` or is false. Iterators and generators are handles whose ``next`` is a request, so
``list(candidate(x))`` drains them in order, lazily, as in one interpreter. Objects of classes
the program defines (``Pair(5, 24)`` in an MBPP test) are handles too, and can be passed back as
arguments. What the test passes that is not plain data or a handle (a lambda, an object of a
class the test defines) cannot cross: the call raises ``TypeError``. An argument the program
mutates is its own copy: the test's value does not change.

The program never sees the test program, its frames or its expected values (they exist only in
the test process), and the verdict is the test process's exit status, read by the host with
``waitpid``: 0 when the test program ran to its end (or exited itself with status 0, as
``check.py`` would), 1 on an exception. Then, as ``check.py`` ends after its tests, the program
process ends when its channel closes (Python's own shutdown: non-daemon threads are joined,
``atexit`` runs), and a pass also needs it to exit with 0 before the deadline: a program can
only fail itself this way, never pass. The program's process can write anything on its end of
the channel, so the test process reads it defensively: a message is a 4-byte big-endian length
and that many bytes of JSON, at most :data:`MAX_MESSAGE` bytes, nested at most
``plaindata.MAX_DEPTH`` deep; a reply must answer the request just sent (its ``id``) with exactly
``value`` or ``raise``. Anything else (a forged or unsolicited message, garbage, a closed channel,
a ``ready`` message that never comes) ends the test process at once with status 1, which no
``try`` in the test program can catch. A call that never returns runs into the run's deadline.

Messages (JSON objects), program to test: ``{"ready": {name: <plain data> | {"module": [name,
ref]}}}`` once, then one reply per request: ``{"id": n, "value": <plain data>}`` or ``{"id": n,
"raise": [exception class name, message]}``. Test to program: ``{"id": n, "ref": r, "op": op,
...}`` with ``op`` one of ``call`` (``args``: plain-data list, ``kwargs``: plain-data dict),
``getattr`` (``name``), ``iter``, ``next``, ``len``, ``bool``, ``str``, ``repr``, ``getitem``
(``key``) and ``contains`` (``item``).
"""

from __future__ import annotations

import base64
import builtins
import functools
import importlib
import json
import marshal
import os
import struct
import sys
import types
from typing import Any, NoReturn, Sequence

from .. import plaindata

__all__ = ["Handle", "ProgramError", "run_tests", "server_command", "MAX_MESSAGE",
           "PROGRAM_FILE"]

MAX_MESSAGE = 64 * 1024**2
PROGRAM_FILE = "program.py"
_HEADER = struct.Struct("!I")
_FAILED = 1
# Exceptions a reply may raise as themselves: the standard ones an ordinary program raises.
_BUILTIN_NAMES = frozenset(vars(builtins))
_RAISABLE = {name: value for name, value in vars(builtins).items()
             if isinstance(value, type) and issubclass(value, Exception)}


class ProgramError(Exception):
    """An exception of the program's that is not one of the standard exceptions (its own class,
    or ``SystemExit``, ``KeyboardInterrupt``): raised in the test process under this name."""


@functools.lru_cache(maxsize=None)
def server_command(python: str) -> tuple[str, ...]:
    """The program process's command: :mod:`.program_server` with the plain-data module, as one
    ``-c`` text (standard library only). Both are compiled here, once per worker, and travel as
    marshalled code (the sandbox runs the same interpreter), so a run does not compile them."""
    here = os.path.dirname(os.path.abspath(__file__))
    codes = []
    for path in (os.path.join(os.path.dirname(here), "plaindata.py"),
                 os.path.join(here, "program_server.py")):
        with open(path) as handle:
            codes.append(compile(handle.read(), os.path.basename(path), "exec",
                                 dont_inherit=True))
    packed = base64.b64encode(marshal.dumps(tuple(codes))).decode("ascii")
    text = ("import binascii, marshal, types\n"
            f"_alodlm_codes = marshal.loads(binascii.a2b_base64('{packed}'))\n"
            "_alodlm_plaindata = types.ModuleType('_alodlm_plaindata')\n"
            "exec(_alodlm_codes[0], _alodlm_plaindata.__dict__)\n"
            "exec(_alodlm_codes[1])\n"
            f"_alodlm_serve(_alodlm_plaindata, path={PROGRAM_FILE!r})\n")
    return (python, "-I", "-c", text)


# --------------------------------------------------------------------------------------------
# The test process's side
# --------------------------------------------------------------------------------------------


def _violation() -> NoReturn:
    """The program broke the protocol (or left): the tests fail, uncatchably."""
    os._exit(_FAILED)


class _Channel:
    """The test process's end: one request, then exactly its reply."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.next_id = 0
        self.handles: dict[int, Handle] = {}

    def _exactly(self, size: int) -> bytes:
        parts = []
        while size:
            try:
                chunk = os.read(self.fd, min(size, 1 << 20))
            except OSError:
                _violation()
            if not chunk:
                _violation()
            parts.append(chunk)
            size -= len(chunk)
        return b"".join(parts)

    def receive(self) -> Any:
        (size,) = _HEADER.unpack(self._exactly(_HEADER.size))
        if size > MAX_MESSAGE:
            _violation()
        try:
            message = json.loads(self._exactly(size))
        except (ValueError, RecursionError, MemoryError):
            _violation()
        if type(message) is not dict:
            _violation()
        return message

    def send(self, message: dict) -> None:
        data = json.dumps(message, separators=(",", ":")).encode()
        data = _HEADER.pack(len(data)) + data
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            _violation()

    def value(self, data: Any) -> Any:
        try:
            return plaindata.decode(data, resolve=self.handle)
        except (plaindata.Unrepresentable, RecursionError, MemoryError):
            _violation()

    def handle(self, ref: int) -> "Handle":
        found = self.handles.get(ref)
        if found is None:
            found = self.handles[ref] = Handle(self, ref)
        return found

    def data(self, value: Any) -> Any:
        """An argument as plain data: handles as references; anything else is a TypeError."""
        try:
            return plaindata.encode(value, refer=self._reference)
        except plaindata.Unrepresentable as error:
            raise TypeError(f"cannot pass to the program: {error}") from None

    def _reference(self, value: Any) -> int:
        if type(value) is Handle and object.__getattribute__(value, "_channel") is self:
            return object.__getattribute__(value, "_ref")
        raise TypeError(f"cannot pass a {type(value).__name__} to the program (only plain data "
                        "and the program's own objects cross)")

    def request(self, ref: int, op: str, **fields: Any) -> Any:
        number = self.next_id
        self.next_id += 1
        self.send({"id": number, "ref": ref, "op": op, **fields})
        reply = self.receive()
        if reply.get("id") != number or type(reply.get("id")) is not int or len(reply) != 2:
            _violation()
        if "value" in reply:
            return self.value(reply["value"])
        raised = reply.get("raise")
        if (type(raised) is not list or len(raised) != 2
                or type(raised[0]) is not str or type(raised[1]) is not str):
            _violation()
        kind = _RAISABLE.get(raised[0])
        if kind is None:
            raise ProgramError(f"{raised[0]}: {raised[1]}")
        try:
            error = kind(raised[1])
        except Exception:  # noqa: BLE001 - a standard exception that needs other arguments
            error = ProgramError(f"{raised[0]}: {raised[1]}")
        raise error


def _exact(value: Any, kind: type) -> Any:
    if type(value) is not kind:
        _violation()
    return value


class Handle:
    """An object of the program's, which stays in the program's process (module docstring).

    Equality and hashing are this object's identity; nothing is forwarded but the operations
    listed, each one request."""

    __slots__ = ("_channel", "_ref", "__weakref__")

    def __init__(self, channel: _Channel, ref: int) -> None:
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_ref", ref)

    def _request(self, op: str, **fields: Any) -> Any:
        channel = object.__getattribute__(self, "_channel")
        return channel.request(object.__getattribute__(self, "_ref"), op, **fields)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        channel = object.__getattribute__(self, "_channel")
        return self._request("call", args=channel.data(list(args)), kwargs=channel.data(kwargs))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._request("getattr", name=name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("the program's objects cannot be changed from the tests")

    def __iter__(self) -> Any:
        return self._request("iter")

    def __next__(self) -> Any:
        return self._request("next")

    def __len__(self) -> int:
        return _exact(self._request("len"), int)

    def __bool__(self) -> bool:
        return _exact(self._request("bool"), bool)

    def __str__(self) -> str:
        return _exact(self._request("str"), str)

    def __repr__(self) -> str:
        return _exact(self._request("repr"), str)

    def __getitem__(self, key: Any) -> Any:
        channel = object.__getattribute__(self, "_channel")
        return self._request("getitem", key=channel.data(key))

    def __contains__(self, item: Any) -> bool:
        channel = object.__getattribute__(self, "_channel")
        return _exact(self._request("contains", item=channel.data(item)), bool)


def _trusted_path(read_paths: Sequence[str]) -> list[str]:
    """``sys.path`` without entries the program could write into: only absolute entries beneath
    the sandbox's read-only paths are kept (not the evaluator's working directory, which may lie
    under the program's writable ``/tmp``)."""
    def beneath(entry: str) -> bool:
        return os.path.isabs(entry) and any(
            entry == path or entry.startswith(path.rstrip("/") + "/") for path in read_paths)

    return [entry for entry in sys.path if type(entry) is str and beneath(entry)]


def _namespace(channel: _Channel, ready: Any) -> dict:
    namespace = {"__name__": "__main__", "__builtins__": builtins, "__doc__": None,
                 "__file__": os.path.abspath("check.py")}
    if type(ready) is not dict:
        _violation()
    for name, data in ready.items():
        if name in _BUILTIN_NAMES or name in namespace:
            continue  # the test's own builtins: the program cannot redefine set() or len() for it
        if type(data) is dict and list(data) == ["module"]:
            module_data = data["module"]
            if (type(module_data) is not list or len(module_data) != 2
                    or type(module_data[0]) is not str or type(module_data[1]) is not int):
                _violation()
            try:
                namespace[name] = importlib.import_module(module_data[0])
            except BaseException:  # noqa: BLE001 - not importable here: the program's module
                namespace[name] = channel.value({"handle": module_data[1]})
        else:
            namespace[name] = channel.value(data)
    return namespace


def run_tests(tests: str, channel_fd: int, read_paths: Sequence[str], *,
              flags: int = 0) -> NoReturn:
    """The test process: wait for the program's names, run ``tests`` (compiled with the
    program's ``__future__`` ``flags``, as in ``check.py``) with them, and exit with the test
    program's status (0: it ran to its end)."""
    sys.path[:] = _trusted_path(read_paths)
    sys.path_importer_cache.clear()
    sys.set_int_max_str_digits(0)
    sys.argv = ["check.py"]
    channel = _Channel(channel_fd)
    message = channel.receive()
    if list(message) != ["ready"]:
        _violation()
    namespace = _namespace(channel, message["ready"])
    main = types.ModuleType("__main__")
    main.__dict__.update(namespace)
    sys.modules["__main__"] = main
    try:
        code = compile(tests, "check.py", "exec", flags, dont_inherit=True)
        exec(code, main.__dict__)
    except SystemExit as exit_:
        os._exit(_exit_status(exit_.code))
    except BaseException:  # noqa: BLE001 - a failed test
        os._exit(_FAILED)
    os._exit(0)


def _exit_status(code: Any) -> int:
    """What ``python`` exits with for ``sys.exit(code)``."""
    if code is None:
        return 0
    if type(code) is int or type(code) is bool:
        return int(code) & 0xFF
    return 1
