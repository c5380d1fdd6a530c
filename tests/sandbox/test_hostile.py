"""Hostile programs against the code sandbox (SCORING.md D10), through the real evaluation flow.

One rescore run per rule set scores every case of :mod:`.hostile` (both code metrics, two
workers, the default sandbox; the reference's rules, then the strict rules, whose python_tests
run the program and its tests in two processes) with honest canary tasks after each attack;
each case then checks its verdict, that nothing outside the run changed (victim files keep
content, mode and timestamps; targets do not exist; listeners received nothing), and at the end
that no process any case started is left and no worker was lost.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

import psutil
import pytest

from alodlm_scoring import evaluation
from evaluation import suites

from . import hostile
from .conftest import require

_VICTIM_TEXT = "victim\n"
_VICTIM_TIME = 1_000_000_000


def _task(case: hostile.Case, index: int) -> dict:
    if case.metric == "python_tests":
        return suites.python_task(f"{index:02d}_{case.name}", timeout=case.timeout)
    return suites.evalplus_task(f"{index:02d}_{case.name}")


def _snapshot(directory: str) -> dict:
    seen = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            seen[os.path.relpath(path, directory)] = (info.st_mode, info.st_size,
                                                      info.st_mtime_ns)
    return seen


def _marked(marker: str, names: set[str]) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.name() in names or any(marker in part for part in process.cmdline()):
                found.append(process)
        except (psutil.Error, OSError):
            continue
    return found


@pytest.fixture(scope="module", params=["reference", "strict"])
def hostile_run(request, tmp_path_factory, sandbox_mechanisms):
    rules = request.param
    base = tmp_path_factory.mktemp(f"hostile_{rules}")
    outside = base / "outside"
    home = base / "home"
    outside.mkdir()
    home.mkdir()
    for name in {victim for case in hostile.CASES for victim in case.victims}:
        path = outside / name
        path.write_text(_VICTIM_TEXT)
        os.chmod(path, 0o644)
        os.utime(path, (_VICTIM_TIME, _VICTIM_TIME))
    secret = "s3cret-" + uuid.uuid4().hex
    (outside / "secret.txt").write_text(secret)
    marker = uuid.uuid4().hex[:12]
    tcp = socket.create_server(("127.0.0.1", 0))
    tcp.setblocking(False)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    abstract = f"alodlm-test-{marker}"
    abstract_socket = socket.socket(socket.AF_UNIX)
    abstract_socket.bind("\0" + abstract)
    abstract_socket.listen()
    abstract_socket.setblocking(False)
    unix_path = outside / "service.sock"
    unix_socket = socket.socket(socket.AF_UNIX)
    unix_socket.bind(os.fspath(unix_path))
    unix_socket.listen()
    unix_socket.setblocking(False)
    tasks_path = base / "tasks.jsonl"
    values = {"outside": outside, "marker": marker, "secret": secret,
              "secret_file": outside / "secret.txt", "home": home, "tasks_path": tasks_path,
              "port": tcp.getsockname()[1], "udp_port": udp.getsockname()[1],
              "abstract": abstract, "unix_path": unix_path}

    runnable, names, pairs = {}, set(), []
    for index, case in enumerate(hostile.CASES):
        if any(n not in sandbox_mechanisms for n in case.needs) or (
                case.needs_any and not any(n in sandbox_mechanisms for n in case.needs_any)):
            continue
        comm = f"h{index:02d}{marker}"[:15]
        names.add(comm)
        task = _task(case, index)
        program = hostile.render(case.program, {**values, "comm": comm})
        pairs.append((task, "```python\n" + program + "```"))
        runnable[case.name] = task["id"]
        # Honest canaries right after each attack: a forged or shifted verdict shows here.
        pairs.append((suites.python_task(f"{index:02d}_canary_pass"), suites.identity_code("x")))
        pairs.append((suites.python_task(f"{index:02d}_canary_fail"), suites.identity_code("0")))
    before = _snapshot(outside)
    _, predictions_path = suites.write_suite(base, pairs)
    assert os.path.exists(tasks_path)

    environ = {"ALODLM_TEST_SECRET": secret, "HOME": os.fspath(home)}
    saved = {key: os.environ.get(key) for key in environ}
    os.environ.update(environ)
    started = time.monotonic()
    try:
        summary = evaluation.rescore(tasks_path, predictions_path, base / "out", workers=2,
                                     code_verdicts=rules)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    elapsed = time.monotonic() - started
    rows = [json.loads(line) for line in (base / "out" / "predictions.jsonl").read_text().splitlines()]
    deadline = time.monotonic() + 10
    leftovers = _marked(marker, names)
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.2)
        leftovers = _marked(marker, names)
    received = []
    for listener in (tcp, abstract_socket, unix_socket):
        try:
            connection, _ = listener.accept()
            received.append(connection.recv(100))
        except (BlockingIOError, OSError):
            pass
    try:
        received.append(udp.recv(100))
    except (BlockingIOError, OSError):
        pass
    for listener in (tcp, udp, abstract_socket, unix_socket):
        listener.close()
    yield {"verdicts": {row["id"]: row["correct"] for row in rows}, "runnable": runnable,
           "values": values, "outside": outside, "before": before, "after": _snapshot(outside),
           "summary": summary, "elapsed": elapsed, "leftovers": leftovers,
           "received": received, "home": home, "rules": rules}
    for process in leftovers:
        try:
            process.kill()
        except psutil.Error:
            pass


@pytest.mark.parametrize("case", hostile.CASES, ids=[case.name for case in hostile.CASES])
def test_hostile_program(case, hostile_run, sandbox_mechanisms):
    require(sandbox_mechanisms, case.needs, case.needs_any)
    task_id = hostile_run["runnable"][case.name]
    expected = case.verdict
    if hostile_run["rules"] == "strict" and case.strict_verdict is not None:
        expected = case.strict_verdict
    assert hostile_run["verdicts"][task_id] is expected
    index = task_id.split("_", 1)[0]
    assert hostile_run["verdicts"][f"{index}_canary_pass"] is True
    assert hostile_run["verdicts"][f"{index}_canary_fail"] is False
    outside = hostile_run["outside"]
    for name in case.victims:
        path = outside / name
        assert path.read_text() == _VICTIM_TEXT
        info = os.stat(path)
        assert (info.st_mode & 0o7777, int(info.st_mtime)) == (0o644, _VICTIM_TIME)
    for template in case.absent:
        assert not os.path.lexists(hostile.render(template, hostile_run["values"]))


def test_nothing_outside_changed_and_nothing_survived(hostile_run):
    assert hostile_run["after"] == hostile_run["before"]
    assert list(hostile_run["home"].iterdir()) == []
    assert hostile_run["received"] == []
    assert hostile_run["leftovers"] == [], [p.cmdline() for p in hostile_run["leftovers"]]
    assert hostile_run["summary"]["protocol"]["scoring_failures"] == []
    # Every case is bounded: a few seconds each on two workers (the slowest ones time out at
    # 3 s or hit their limits), far below the parent-side timeouts.
    assert hostile_run["elapsed"] < 180, hostile_run["elapsed"]


def test_there_are_at_least_thirty_hostile_programs_across_both_metrics():
    metrics = {case.metric for case in hostile.CASES}
    assert len(hostile.CASES) >= 30 and metrics == {"python_tests", "evalplus"}
