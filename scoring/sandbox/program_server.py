"""The program process of strict python_tests: runs the model's program, then serves calls.

This file is never imported by the scorer. :func:`alodlm_scoring.sandbox.calls.server_command`
sends its text, after :mod:`alodlm_scoring.plaindata`'s, to ``python -I -c`` in the sandbox (the
project's files are not in the sandbox's filesystem), so it uses the standard library only and
finds ``encode``, ``decode`` and ``Unrepresentable`` in the plain-data module it is given.

:func:`serve` executes ``program.py`` as ``__main__`` (as ``python -I check.py`` executes the
program's part of ``check.py``), then writes one *ready* message on the channel (descriptor 3):
each top-level name of the program with its value as plain data, a module as its name, anything
else as a handle. Then it answers requests one at a time until the channel closes. Messages are
length-prefixed JSON (:mod:`alodlm_scoring.sandbox.calls` describes them and reads them
defensively: everything here runs in the program's process and is untrusted).
"""

import builtins
import json
import os
import struct
import sys
import types

_ALODLM_HEADER = struct.Struct("!I")


def _alodlm_serve(plaindata, channel=3, path="program.py"):
    header = _ALODLM_HEADER
    dumps, loads = json.dumps, json.loads
    encode, decode = plaindata.encode, plaindata.decode
    objects, refs = [], {}

    def refer(value):
        ref = refs.get(id(value))
        if ref is None:
            ref = refs[id(value)] = len(objects)
            objects.append(value)  # kept alive: its id stays unique
        return ref

    def resolve(ref):
        return objects[ref]

    def send(message):
        data = dumps(message, separators=(",", ":")).encode("utf-8", "surrogatepass")
        data = header.pack(len(data)) + data
        while data:
            data = data[os.write(channel, data):]

    def exactly(size):
        parts = []
        while size:
            chunk = os.read(channel, min(size, 1 << 20))
            if not chunk:  # the test process is done: end as check.py ends after its tests
                raise SystemExit(0)
            parts.append(chunk)
            size -= len(chunk)
        return b"".join(parts)

    def as_data(value):
        try:
            return encode(value, refer=refer)
        except Exception:  # noqa: BLE001 - too deep, too large, or not data: a handle
            return {"handle": refer(value)}

    sys.set_int_max_str_digits(0)  # large ints cross as data, as they compare in check.py
    main = types.ModuleType("__main__")
    main.__file__ = os.path.abspath(path)
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    sys.argv = [path]
    try:
        with open(path) as handle:
            code = compile(handle.read(), path, "exec", dont_inherit=True)
        exec(code, main.__dict__)
    except BaseException:  # noqa: BLE001 - as check.py failing before its tests
        os._exit(1)
    names = {}
    for name, value in list(dict.items(main.__dict__)):
        if type(name) is not str or (name.startswith("__") and name.endswith("__")):
            continue
        if type(value) is types.ModuleType:
            module = value.__dict__.get("__name__")
            names[name] = {"module": [module if type(module) is str else "", refer(value)]}
        else:
            names[name] = as_data(value)
    send({"ready": names})
    # The calls start this many frames deep, check.py's from its module level (one frame): the
    # limit grows by the difference, so recursion fails where it would in check.py.
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    sys.setrecursionlimit(sys.getrecursionlimit() + depth - 1)
    unary = {"iter": iter, "next": next, "len": len, "bool": bool, "str": str, "repr": repr}
    while True:
        request = loads(exactly(header.unpack(exactly(header.size))[0]))
        number = request["id"]
        try:
            target = objects[request["ref"]]
            operation = request["op"]
            if operation == "call":
                result = target(*decode(request["args"], resolve=resolve),
                                **decode(request["kwargs"], resolve=resolve))
            elif operation == "getattr":
                result = getattr(target, request["name"])
            elif operation in unary:
                result = unary[operation](target)
            elif operation == "getitem":
                result = target[decode(request["key"], resolve=resolve)]
            elif operation == "contains":
                result = decode(request["item"], resolve=resolve) in target
            else:
                raise ValueError(f"unknown operation {operation!r}")
        except BaseException as error:  # noqa: BLE001 - the test process decides what it means
            try:
                message = str(error)
            except BaseException:  # noqa: BLE001
                message = ""
            send({"id": number, "raise": [type(error).__name__, message[:10000]]})
            continue
        send({"id": number, "value": as_data(result)})
