"""Strict python_tests' call channel, from the test process's side (``calls.run_tests``).

The test process runs in a child interpreter here (no sandbox: what is tested is how it reads
the channel), and this process plays the program process, honestly or not. Every hostile answer
is paired with an honest one that passes, so a failure is the defence's doing, not the script's.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys

import pytest

from alodlm_scoring.sandbox import calls

_CHILD = ("import sys\nfrom alodlm_scoring.sandbox import calls\n"
          "calls.run_tests(sys.argv[1], int(sys.argv[2]), [])\n")


def frame(message) -> bytes:
    data = message if isinstance(message, bytes) else json.dumps(message).encode()
    return struct.pack("!I", len(data)) + data


def _read_request(sock: socket.socket) -> dict | None:
    def exactly(size):
        data = b""
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    header = exactly(4)
    if header is None:
        return None
    return json.loads(exactly(struct.unpack("!I", header)[0]))


def run(tests: str, ready, answer=None, *, requests: int = 10) -> tuple[int, list[dict]]:
    """The test process's exit status, with this process answering as the program: ``ready``
    (a message, or raw bytes) first, then ``answer(request)`` (bytes) for each request; without
    ``answer`` it closes its end after ``ready``."""
    mine, theirs = socket.socketpair()
    child = subprocess.Popen([sys.executable, "-c", _CHILD, tests, str(theirs.fileno())],
                             pass_fds=(theirs.fileno(),), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    theirs.close()
    mine.settimeout(20)
    seen = []
    try:
        mine.sendall(ready if isinstance(ready, bytes) else frame(ready))
        if answer is None:
            mine.shutdown(socket.SHUT_WR)  # the program leaves: nothing more arrives
        for _ in range(requests):
            request = _read_request(mine)
            if request is None:
                break
            seen.append(request)
            if answer is None:
                break
            mine.sendall(answer(request))
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        mine.close()  # the program has left: a test process still reading sees the end
        status = child.wait(timeout=30)
    return status, seen


F = {"ready": {"f": {"handle": 0}}}


def value(result):
    return lambda request: frame({"id": request["id"], "value": result})


def test_an_honest_program_passes_and_a_wrong_one_fails():
    status, seen = run("assert f(3) == 3", F, value(3))
    assert status == 0
    assert seen == [{"id": 0, "ref": 0, "op": "call", "args": [3], "kwargs": {"dict": []}}]
    assert run("assert f(3) == 3", F, value(4))[0] == 1


@pytest.mark.parametrize("ready", [
    {"verdict": "pass"}, {"ready": {}, "exit": 0}, {"ready": []}, b"\xff" * 16, b"",
    frame(b"[" * 100000 + b"]" * 100000), struct.pack("!I", 2**32 - 1) + b"{}",
    {"ready": {"f": {"module": ["math", "x"]}}}, {"ready": {"f": {"handle": -1}}},
], ids=["verdict", "extra-key", "not-a-dict", "garbage", "closed", "deep-json", "oversized",
        "malformed-module", "malformed-handle"])
def test_anything_but_a_ready_message_first_fails(ready):
    assert run("pass", {"ready": {}})[0] == 0
    assert run("pass", ready)[0] == 1


@pytest.mark.parametrize("reply", [
    lambda request: frame({"verdict": "pass"}),
    lambda request: frame({"exit": 0}),
    lambda request: frame({"id": request["id"] + 1, "value": 3}),
    lambda request: frame({"id": str(request["id"]), "value": 3}),
    lambda request: frame({"id": request["id"], "value": 3, "exit": 0}),
    lambda request: frame({"id": request["id"], "raise": "SystemExit"}),
    lambda request: frame({"id": request["id"], "value": {"handle": "0"}}),
    lambda request: frame({"id": request["id"], "value": {"tuple": 3}}),
    lambda request: frame(b"[" * 100000 + b"]" * 100000),
    lambda request: frame(b"{\"id\": 0, \"value\": " + b"[" * 150 + b"]" * 150 + b"}"),
    lambda request: struct.pack("!I", calls.MAX_MESSAGE + 1) + b"{}",
    lambda request: b"\x00\x00",
    lambda request: b"not a frame at all",
], ids=["verdict", "exit", "wrong-id", "string-id", "extra-key", "malformed-raise", "malformed-handle", "malformed-data",
        "deep-json", "deeper-than-plain-data", "oversized", "truncated", "garbage"])
def test_a_forged_or_malformed_reply_fails_even_when_the_tests_catch_everything(reply):
    tests = ("try:\n    result = f(3)\nexcept BaseException:\n    result = 3\n"
             "assert result == 3")
    assert run(tests, F, value(3))[0] == 0
    assert run(tests, F, lambda request: frame({"id": request["id"],
                                                "raise": ["ValueError", "no"]}))[0] == 0
    assert run(tests, F, reply, requests=1)[0] == 1


def test_exceptions_cross_as_standard_exceptions_or_program_errors():
    tests = ("try:\n    f(3)\nexcept ValueError as error:\n    assert str(error) == 'bad'\n"
             "else:\n    assert False\n")
    raising = lambda name: lambda request: frame({"id": request["id"], "raise": [name, "bad"]})  # noqa: E731
    assert run(tests, F, raising("ValueError"))[0] == 0
    assert run(tests, F, raising("MyValueError"))[0] == 1
    tests = ("try:\n    f(3)\nexcept Exception as error:\n"
             "    assert type(error).__name__ == 'ProgramError'\n")
    assert run(tests, F, raising("MyValueError"))[0] == 0
    assert run(tests, F, raising("SystemExit"))[0] == 0  # not the test process's own exit
    assert run(tests, F, raising("KeyboardInterrupt"))[0] == 0


def test_handles_equal_only_themselves_and_answer_only_with_exact_types():
    tests = "r = f(3)\nassert r != 3 and r is f(3) and r == r\nassert r\n"
    replies = iter([{"handle": 7}, {"handle": 7}, True])
    answer = lambda request: frame({"id": request["id"], "value": next(replies)})  # noqa: E731
    status, seen = run(tests, F, answer)
    assert status == 0 and [r["op"] for r in seen] == ["call", "call", "bool"]
    assert seen[2]["ref"] == 7
    for lie in (1, "yes", None):  # __bool__ must answer a bool
        replies = iter([{"handle": 7}, {"handle": 7}, lie])
        assert run(tests, F, answer)[0] == 1


def test_iteration_drains_a_remote_iterator_in_order():
    items = iter([{"handle": 1}, {"handle": 1}, 10, 20])

    def answer(request):
        if request["op"] == "len":  # list() asks for a length hint; a generator has none
            return frame({"id": request["id"], "raise": ["TypeError", "no len()"]})
        if request["op"] == "next" and request["id"] == 5:
            return frame({"id": request["id"], "raise": ["StopIteration", ""]})
        return frame({"id": request["id"], "value": next(items)})

    status, seen = run("assert list(f(2)) == [10, 20]", F, answer)
    assert status == 0
    assert [r["op"] for r in seen] == ["call", "iter", "len", "next", "next", "next"]


def test_the_program_cannot_redefine_the_tests_builtins_or_send_plain_data():
    ready = {"ready": {"int": {"handle": 1}, "len": 5, "f": {"handle": 0}, "C": [1, 2]}}
    status, seen = run("assert int('3') == 3 and len('ab') == 2 and C == [1, 2]", ready)
    assert status == 0 and seen == []


def test_arguments_cross_as_plain_data_and_handles_only():
    ready = {"ready": {"f": {"handle": 0}, "Pair": {"handle": 1}}}
    status, seen = run("p = Pair(1, 2)\nassert f([p, (1, {2})], key='k') == 3", ready,
                       lambda request: frame({"id": request["id"],
                                              "value": {"handle": 9} if request["ref"] == 1 else 3}))
    assert status == 0
    assert seen[1]["args"] == [[{"handle": 9}, {"tuple": [1, {"set": [2]}]}]]
    assert seen[1]["kwargs"] == {"dict": [["key", "k"]]}
    tests = "try:\n    f(lambda: 3)\nexcept TypeError:\n    pass\nelse:\n    assert False\n"
    status, seen = run(tests, F, value(3))
    assert status == 0 and seen == []


def test_the_tests_own_exit_decides_as_in_check_py():
    for tests, status in (("import sys\nsys.exit(0)", 0), ("import sys\nsys.exit(3)", 3),
                          ("raise SystemExit('text')", 1), ("assert False", 1),
                          ("syntax error here", 1)):
        assert run(tests, {"ready": {}})[0] == status
