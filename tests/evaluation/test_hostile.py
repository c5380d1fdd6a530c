"""Hostile generated programs WITHOUT the code sandbox (``code_sandbox="off"``, the reference's
way of running code): each scores False within its limit, the evaluator survives, and no process
of the task remains afterwards (SCORING.md §5.5). The sandboxed equivalents, and many more, are in
tests/sandbox/.

Every process a task starts inherits a unique marker through its environment (the workers get
the evaluator's environment), so psutil can find anything that escaped.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
import time
import uuid

import psutil

from alodlm_scoring import evaluation

from . import suites

HOSTILE_PROGRAMS = {
    "infinite_loop": "def identity(x):\n    return x\nwhile True:\n    pass\n",
    # Touches ~1.5 GiB, then stalls: capped or timed out, never a pass.
    "memory_hog": (
        "def identity(x):\n    return x\n"
        "blocks = []\n"
        "for _ in range(24):\n"
        "    blocks.append(bytearray(b'x' * (64 * 1024 * 1024)))\n"
        "import time\ntime.sleep(60)\n"
    ),
    # A bounded spawn: 200 sleeping children, half in their own sessions, then a failing test.
    "spawn_200_children": (
        "import os, time\n"
        "def identity(x):\n    return x\n"
        "for i in range(200):\n"
        "    if os.fork() == 0:\n"
        "        if i % 2:\n"
        "            os.setsid()\n"
        "        time.sleep(600)\n"
        "        os._exit(0)\n"
        "raise SystemExit(1)\n"
    ),
    "shell_and_subprocess": (
        "import os, subprocess\n"
        "def identity(x):\n    return x\n"
        "os.system('sleep 600 &')\n"
        "subprocess.Popen(['sleep', '601'], start_new_session=True)\n"
        "assert os.system('exit 3') == 0\n"
    ),
    "write_outside_cwd": (
        "def identity(x):\n    return x\n"
        "open('../escaped_{marker}.txt', 'w').write('x')\n"
        "open('../../escaped_{marker}.txt', 'w').write('x')\n"
        "raise SystemExit(1)\n"
    ),
    "kill_parent": (
        "import os, signal\n"
        "def identity(x):\n    return x\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
    ),
    "print_megabytes": (
        "import os, sys\n"
        "def identity(x):\n    return x\n"
        "for _ in range(8):\n"
        "    print('[true, null]' * 100000)\n"
        "    os.write(1, b'[true, null]\\n' * 10000)\n"
        "    sys.stderr.write('x' * 1000000)\n"
        "raise SystemExit(1)\n"
    ),
}


def _marked_processes(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid == os.getpid():
                continue
            if any(marker in part for part in process.cmdline()):
                found.append(process)
                continue
            if process.environ().get("ALODLM_TEST_MARKER") == marker:
                found.append(process)
        except (psutil.Error, OSError):
            continue
    return found


def test_hostile_programs_score_false_and_leave_nothing_behind(tmp_path, monkeypatch):
    marker = "hostile-" + uuid.uuid4().hex
    monkeypatch.setenv("ALODLM_TEST_MARKER", marker)
    pairs = []
    for name, program in HOSTILE_PROGRAMS.items():
        task = suites.python_task(name, timeout=3)
        pairs.append((task, "```python\n" + program.replace("{marker}", marker) + "```"))
    pairs.append((suites.python_task("still_works"), suites.identity_code("x")))
    tasks_path, predictions_path = suites.write_suite(tmp_path, pairs)

    started = time.monotonic()
    summary = evaluation.rescore(tasks_path, predictions_path, tmp_path / "out", workers=2,
                                 code_sandbox="off")
    elapsed = time.monotonic() - started

    rows = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    verdicts = {row["id"]: row["correct"] for row in rows}
    assert verdicts == {**{name: False for name in HOSTILE_PROGRAMS}, "still_works": True}
    # Each hostile task is bounded by its 3 s limit (two workers, seven tasks).
    assert elapsed < 40, elapsed
    failures = summary["protocol"]["scoring_failures"]
    assert failures == [{"benchmark": "mbpp", "id": "kill_parent",
                         "reason": "code_scoring_worker_died"}]

    deadline = time.monotonic() + 10
    leftovers = _marked_processes(marker)
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.2)
        leftovers = _marked_processes(marker)
    assert leftovers == [], [p.cmdline() for p in leftovers]
    # Relative escapes land in the worker's scratch directory (its TMPDIR), removed with the pool.
    # Without that, they would land in the system temporary directory or its parent.
    temporary = tempfile.gettempdir()
    candidates = {temporary, os.path.dirname(temporary), os.getcwd(), str(tmp_path)}
    escaped = [path for directory in candidates
               for path in glob.glob(os.path.join(directory, f"*{marker}*"))]
    assert escaped == []
    assert glob.glob(os.path.join(temporary, "alodlm-scoring-*", f"**/*{marker}*"),
                     recursive=True) == []


FORGE = (
    "import os\n"
    "def identity(x):\n    return 0\n"
    "parent = os.getppid()\n"
    "for fd in os.listdir('/proc/%d/fd' % parent):\n"
    "    try:\n"
    "        with open('/proc/%d/fd/%s' % (parent, fd), 'w') as f:\n"
    "            f.write(LINE)\n"
    "    except OSError:\n"
    "        pass\n"
)


def test_a_forged_or_garbage_reply_is_a_recorded_failure_and_the_run_goes_on(tmp_path):
    """Without the sandbox a program can reach its worker's reply pipe; the nonce catches it:
    the task is scored incorrect with a recorded reason, the worker is replaced, and every
    later verdict is its own."""
    forged = '{"nonce": null, "verdict": [true, null]}\n[true, null]\n'
    pairs = [
        (suites.python_task("forged"), "```python\n" + FORGE.replace("LINE", repr(forged)) + "```"),
        (suites.python_task("after_forged_pass"), suites.identity_code("x")),
        (suites.python_task("after_forged_fail"), suites.identity_code("0")),
        (suites.python_task("garbage"), "```python\n" + FORGE.replace("LINE", repr("not json\n")) + "```"),
        (suites.python_task("after_garbage_pass"), suites.identity_code("x")),
        (suites.python_task("after_garbage_fail"), suites.identity_code("0")),
    ]
    tasks_path, predictions_path = suites.write_suite(tmp_path, pairs)
    summary = evaluation.rescore(tasks_path, predictions_path, tmp_path / "out", workers=1,
                                 code_sandbox="off")
    rows = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert [row["correct"] for row in rows] == [False, True, False, False, True, False]
    assert summary["protocol"]["scoring_failures"] == [
        {"benchmark": "mbpp", "id": "forged", "reason": "code_scoring_protocol_error"},
        {"benchmark": "mbpp", "id": "garbage", "reason": "code_scoring_protocol_error"},
    ]
