"""Hostile generated programs, each with the verdict it must get and what it must not change.

Every program tries one attack and is otherwise written so that it *passes* if the attack works
(or shows that it worked), so a leaky sandbox turns a verdict and the test fails. Placeholders in
braces are filled by :func:`render`: ``{outside}`` (a directory outside every sandbox, holding
victim files), ``{marker}`` (unique to the test session), ``{comm}`` (a process name, 15
characters, that every spawned process takes so that survivors can be found), ``{secret}`` /
``{secret_file}``, ``{home}`` (the evaluator's ``$HOME``), ``{tasks_path}``, ``{port}`` /
``{udp_port}`` / ``{abstract}`` / ``{unix_path}`` (listeners the test watches).

Everything is bounded: at most 64 processes, 600 threads, 1 GiB of writes, 6 GiB of address
space reserved (never touched), a few seconds each.
"""

from __future__ import annotations

import dataclasses

PY_TESTS = "assert identity(3) == 3"

# A process of a test takes the test's name (the kernel's "comm", 15 characters).
_NAME = (
    "import ctypes as _c\n"
    "def _name():\n"
    "    _c.CDLL(None).prctl(15, b'{comm}', 0, 0, 0)\n"
)
_IDENTITY = "def identity(x):\n    return x\n"
FILESYSTEM = ("minimal-root", "landlock-filesystem", "read-only-filesystem")
READS = ("minimal-root", "landlock-filesystem")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    metric: str  # python_tests or evalplus
    program: str
    verdict: bool | None  # under the reference rules; None: whatever the program earns there
    victims: tuple[str, ...] = ()  # files under {outside} that must keep content, mode, mtime
    absent: tuple[str, ...] = ()  # paths (placeholders allowed) that must not exist afterwards
    needs: tuple[str, ...] = ()  # sandbox mechanisms the case needs, all of them
    needs_any: tuple[str, ...] = ()  # ... and at least one of these
    timeout: float = 3.0
    strict_verdict: bool | None = None  # when the strict rules decide otherwise
    tests: str = PY_TESTS  # python_tests: the task's test program


CASES = [
    # ---- filesystem -------------------------------------------------------------------------
    Case("write_absolute_path", "python_tests",
         "open('{outside}/w1_{marker}', 'w').write('x')\n" + _IDENTITY, False,
         absent=("{outside}/w1_{marker}",),
         needs_any=FILESYSTEM),
    Case("os_system_touch", "python_tests",
         "import os\nassert os.system('touch {outside}/w2_{marker}') == 0\n"
         "assert os.path.exists('{outside}/w2_{marker}')\n" + _IDENTITY, False,
         absent=("{outside}/w2_{marker}",),
         needs_any=FILESYSTEM),
    Case("subprocess_shell_write", "python_tests",
         "import subprocess\nsubprocess.run(['sh', '-c', 'echo x > {outside}/w3_{marker}'], check=True)\n"
         + _IDENTITY, False, absent=("{outside}/w3_{marker}",),
         needs_any=FILESYSTEM),
    Case("delete_victim", "python_tests",
         "import os\nos.remove('{outside}/victim_delete')\n" + _IDENTITY, False,
         victims=("victim_delete",),
         needs_any=FILESYSTEM),
    Case("chmod_victim", "python_tests",
         "import os\nos.chmod('{outside}/victim_chmod', 0o777)\n" + _IDENTITY, False,
         victims=("victim_chmod",),
         needs_any=FILESYSTEM),
    Case("truncate_victim", "python_tests",
         "open('{outside}/victim_truncate', 'w').write('pwned')\n" + _IDENTITY, False,
         victims=("victim_truncate",),
         needs_any=FILESYSTEM),
    Case("symlink_escape", "python_tests",
         "import os\nos.symlink('{outside}/victim_symlink', 'link')\n"
         "open('link', 'w').write('pwned')\n" + _IDENTITY, False, victims=("victim_symlink",),
         needs_any=FILESYSTEM),
    Case("hardlink_escape", "python_tests",
         "import os\nos.link('{outside}/victim_hardlink', 'hard')\n"
         "open('hard', 'w').write('pwned')\n" + _IDENTITY, False, victims=("victim_hardlink",),
         needs_any=FILESYSTEM),
    Case("rename_victim_in", "python_tests",
         "import os\nos.rename('{outside}/victim_rename', 'stolen')\n" + _IDENTITY, False,
         victims=("victim_rename",),
         needs_any=FILESYSTEM),
    Case("utime_victim", "python_tests",
         "import os\nos.utime('{outside}/victim_utime', (0, 0))\n" + _IDENTITY, False,
         victims=("victim_utime",),
         needs_any=FILESYSTEM),
    Case("write_home", "python_tests",
         "import os\nopen(os.path.expanduser('~/h_{marker}'), 'w').write('x')\n"
         "assert os.path.exists('{home}/h_{marker}')\n" + _IDENTITY, False,
         absent=("{home}/h_{marker}",),
         needs_any=FILESYSTEM),
    # Writing the private /tmp and /dev/shm is allowed: the program passes, the machine's stay.
    Case("write_tmp_and_dev_shm", "python_tests",
         "open('/tmp/t_{marker}', 'w').write('x')\nopen('/dev/shm/s_{marker}', 'w').write('x')\n"
         + _IDENTITY, True, absent=("/tmp/t_{marker}", "/dev/shm/s_{marker}"),
         needs=("minimal-root",)),
    Case("fill_the_disk", "python_tests",
         "written = 0\nchunk = b'x' * (16 << 20)\n"
         "try:\n    with open('big', 'wb') as f:\n        while written < (2 << 30):\n"
         "            f.write(chunk)\n            written += len(chunk)\nexcept OSError:\n    pass\n"
         "assert written >= (2 << 30)\n" + _IDENTITY, False, timeout=10.0,
         needs=("hard-rlimits",)),
    Case("chmod_own_directory", "python_tests",
         "import os\nos.makedirs('d/e')\nos.chmod('d/e', 0)\nos.chmod('d', 0)\nos.chmod('.', 0)\n"
         + _IDENTITY, True),
    # ---- secrets ----------------------------------------------------------------------------
    Case("environment_secret", "python_tests",
         "import os\nassert os.environ.get('ALODLM_TEST_SECRET') == '{secret}'\n" + _IDENTITY,
         False),
    Case("proc_environ_of_every_process", "python_tests",
         "import os\nfound = False\nfor pid in os.listdir('/proc'):\n"
         "    try:\n        found |= b'{secret}' in open(f'/proc/{pid}/environ', 'rb').read()\n"
         "    except OSError:\n        pass\nassert found\n" + _IDENTITY, False,
         needs_any=("landlock-ptrace-scope", "private-proc")),
    Case("secret_file", "python_tests",
         "assert open('{secret_file}').read() == '{secret}'\n" + _IDENTITY, False,
         needs_any=READS),
    Case("read_the_task_file", "python_tests",
         "assert 'identity' in open('{tasks_path}').read()\n" + _IDENTITY, False,
         needs_any=READS),
    # ---- the verdict channel ----------------------------------------------------------------
    Case("forge_reply_through_proc_fd", "python_tests",
         "import os\nfor pid in os.listdir('/proc'):\n    if not pid.isdigit():\n        continue\n"
         "    try:\n        fds = os.listdir(f'/proc/{pid}/fd')\n    except OSError:\n        continue\n"
         "    for fd in fds:\n        try:\n            with open(f'/proc/{pid}/fd/{fd}', 'w') as f:\n"
         "                f.write('[true, null]\\n{\"nonce\": null, \"verdict\": [true, null]}\\n')\n"
         "        except OSError:\n            pass\n"
         "def identity(x):\n    return 0\n", False,
         needs_any=("landlock-ptrace-scope", "private-proc")),
    Case("garbage_through_proc_fd", "python_tests",
         "import os\nfor pid in os.listdir('/proc'):\n    if not pid.isdigit():\n        continue\n"
         "    try:\n        fds = os.listdir(f'/proc/{pid}/fd')\n    except OSError:\n        continue\n"
         "    for fd in fds:\n        try:\n            with open(f'/proc/{pid}/fd/{fd}', 'w') as f:\n"
         "                f.write('not json\\n')\n        except OSError:\n            pass\n"
         "def identity(x):\n    return 0\n", False,
         needs_any=("landlock-ptrace-scope", "private-proc")),
    Case("kill_the_parent", "python_tests",
         "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n"
         "    pass\n" + _IDENTITY, True,
         needs_any=("pid-namespace", "landlock-signal-scope")),
    Case("kill_every_process", "python_tests",
         "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
         + _IDENTITY, True, needs=("pid-namespace", "landlock-signal-scope")),
    # ---- processes that try to outlive the task ---------------------------------------------
    Case("setsid_double_fork", "python_tests",
         _NAME + "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
         "        _name()\n        time.sleep(600)\n    os._exit(0)\n" + _IDENTITY, True),
    Case("ignore_sigterm_and_sleep", "python_tests",
         _NAME + "import os, signal, time\nif os.fork() == 0:\n"
         "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n    _name()\n    time.sleep(600)\n"
         + _IDENTITY, True),
    Case("kill_worker_then_survive", "python_tests",
         _NAME + "import os, signal, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
         "        _name()\n        time.sleep(20)\n        open('{outside}/late_{marker}', 'w').write('x')\n"
         "    os._exit(0)\nfor pid in (os.getppid(), 1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
         "    except OSError:\n        pass\n" + _IDENTITY, True,
         absent=("{outside}/late_{marker}",),
         needs_any=("pid-namespace", "landlock-signal-scope")),
    Case("fork_bomb_64", "python_tests",
         _NAME + "import os, time\nfor _ in range(64):\n    if os.fork() == 0:\n        _name()\n"
         "        time.sleep(600)\n        os._exit(0)\n" + _IDENTITY, True),
    Case("fork_bomb_past_the_process_limit", "python_tests",
         _NAME + "import os, time\nstarted = 0\nfor _ in range(700):\n    try:\n        pid = os.fork()\n"
         "    except OSError:\n        break\n    if pid == 0:\n        _name()\n        time.sleep(600)\n"
         "        os._exit(0)\n    started += 1\nassert started >= 700\n" + _IDENTITY, False,
         needs=("process-limit",), timeout=10.0),
    Case("thread_bomb_600", "python_tests",
         "import threading, time\nthreads = []\nfor _ in range(600):\n    try:\n"
         "        t = threading.Thread(target=time.sleep, args=(600,))\n        t.start()\n"
         "        threads.append(t)\n    except RuntimeError:\n        break\n" + _IDENTITY, False,
         needs=("hard-rlimits",)),
    Case("raise_memory_limit", "python_tests",
         "import mmap, resource\nsoft, hard = resource.getrlimit(resource.RLIMIT_AS)\n"
         "resource.setrlimit(resource.RLIMIT_AS, (hard, hard))\n"
         "try:\n    resource.setrlimit(resource.RLIMIT_AS, (-1, -1))\nexcept (ValueError, OSError):\n"
         "    pass\nblock = mmap.mmap(-1, 6 << 30)\n" + _IDENTITY, False,
         needs=("hard-rlimits",)),
    Case("huge_output", "python_tests",
         "import os, sys\nfor _ in range(20):\n    print('[true, null]' * 400000)\n"
         "    os.write(1, b'{\"verdict\": [true, null]}\\n' * 100000)\n    sys.stderr.write('x' * 4000000)\n"
         + _IDENTITY, True),
    Case("closed_stdio", "python_tests",
         "import os\nos.close(0)\nos.close(1)\nos.close(2)\n" + _IDENTITY, True),
    # ---- network ----------------------------------------------------------------------------
    Case("tcp_connect_to_listener", "python_tests",
         "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'{marker}')\n"
         + _IDENTITY, False,
         needs_any=("network-namespace", "landlock-tcp")),
    Case("tcp_bind_and_listen", "python_tests",
         "import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\n" + _IDENTITY,
         False,
         needs_any=("network-namespace", "landlock-tcp")),
    Case("udp_send", "python_tests",
         "import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'{marker}', "
         "('127.0.0.1', {udp_port}))\nexcept OSError:\n    pass\n" + _IDENTITY, True,
         needs=("network-namespace",)),
    Case("abstract_unix_socket", "python_tests",
         "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('\\0{abstract}')\ns.sendall(b'{marker}')\n"
         + _IDENTITY, False,
         needs_any=("network-namespace", "landlock-abstract-unix-scope")),
    Case("pathname_unix_socket", "python_tests",
         "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('{unix_path}')\ns.sendall(b'{marker}')\n"
         + _IDENTITY, False,
         needs=("minimal-root",)),
    # ---- evalplus: reliability_guard bypasses and the checker's own channel ------------------
    Case("posix_open_outside", "evalplus",
         "import posix\nposix.close(posix.open('{outside}/e1_{marker}', posix.O_CREAT | posix.O_WRONLY))\n"
         + _IDENTITY, False, absent=("{outside}/e1_{marker}",),
         needs_any=FILESYSTEM),
    Case("posix_spawn_shell", "evalplus",
         "import os, posix\npid = os.posix_spawn('/bin/sh', ['sh', '-c', 'touch {outside}/e2_{marker}'], {})\n"
         "posix.waitpid(pid, 0)\nposix.stat('{outside}/e2_{marker}')\n" + _IDENTITY, False,
         absent=("{outside}/e2_{marker}",),
         needs_any=FILESYSTEM),
    Case("posix_fork_survivor", "evalplus",
         _NAME + "import posix, time\nif posix.fork() == 0:\n    _name()\n    time.sleep(600)\n"
         + _IDENTITY, True),
    Case("forge_checker_status", "evalplus",
         "import posix\nfor fd in range(3, 64):\n    try:\n"
         "        posix.write(fd, b'{\"status\": \"pass\"}\\n')\n    except OSError:\n        pass\n"
         "def identity(x):\n    return 0\n", False),
    Case("kill_the_checkers_parent", "evalplus",
         "import posix, signal\ntry:\n    posix.kill(posix.getppid(), signal.SIGKILL)\nexcept OSError:\n"
         "    pass\n" + _IDENTITY, True,
         needs=("landlock-signal-scope",)),
    Case("evalplus_environment_secret", "evalplus",
         "import os\ndef identity(x):\n    return x if os.environ.get('ALODLM_TEST_SECRET') == '{secret}' else None\n",
         False),
    Case("evalplus_secret_file", "evalplus",
         "import posix\nfd = posix.open('{secret_file}', posix.O_RDONLY)\n"
         "assert posix.read(fd, 100) == b'{secret}'\n" + _IDENTITY, False,
         needs_any=READS),
    Case("evalplus_memory_hog", "evalplus",
         "def identity(x):\n    block = bytearray(6 << 30)\n    return x\n", False),
    Case("evalplus_infinite_loop", "evalplus",
         "def identity(x):\n    while True:\n        pass\n", False),
]

# Strict python_tests' channel (alodlm_scoring.sandbox.calls): one length-prefixed JSON frame.
_FRAME = (
    "import json as _json, os as _os, struct as _struct\n"
    "def _frame(message):\n"
    "    data = message if isinstance(message, bytes) else _json.dumps(message).encode()\n"
    "    return _struct.pack('!I', len(data)) + data\n"
    "def _write(fd, data):\n"
    "    try:\n        _os.write(fd, data)\n    except OSError:\n        pass\n"
)

# Grader tricks: each tries to pass without the right answer. The strict rules must reject every
# one; under the reference's rules the first ones pass (`verdict`), and those aimed at strict
# python_tests' split (its call channel, the test process) have nothing to aim at and fail.
# A trick whose success under the reference's rules depends on the machine (the kernel, the
# allocator, where the tests happen to lie in memory) has `verdict=None`: there its verdict is
# whatever the program earns, and only the run's survival and the canaries are asserted.
TRICKS = [
    Case("early_sys_exit", "python_tests",
         "import sys\ndef identity(x):\n    return 0\nsys.exit(0)\n", True, strict_verdict=False),
    Case("early_os_exit", "python_tests",
         "import os\ndef identity(x):\n    return 0\nos._exit(0)\n", True, strict_verdict=False),
    Case("excepthook_exits_zero", "python_tests",
         "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\ndef identity(x):\n    return 0\n",
         True, strict_verdict=False),
    Case("atexit_exits_zero", "python_tests",
         "import atexit, os\natexit.register(lambda: os._exit(0))\ndef identity(x):\n    return 0\n",
         True, strict_verdict=False),
    Case("eq_always_true", "evalplus",
         "class Anything:\n    def __eq__(self, other):\n        return True\n"
         "def identity(x):\n    return Anything()\n", True, strict_verdict=False),
    Case("read_expected_from_the_graders_frame", "evalplus",
         "import sys\ndef identity(x):\n    frame = sys._getframe(1)\n"
         "    while frame is not None:\n        if 'expected' in frame.f_locals and 'i' in frame.f_locals:\n"
         "            return frame.f_locals['expected'][frame.f_locals['i']]\n"
         "        frame = frame.f_back\n    return None\n", True, strict_verdict=False),
    Case("mark_the_shared_result_passed", "evalplus",
         "import os, sys\ndef identity(x):\n    frame = sys._getframe(1)\n"
         "    while frame is not None and 'stat' not in frame.f_locals:\n        frame = frame.f_back\n"
         "    found = frame.f_locals\n    found['stat'].value = 0\n"
         "    for i in range(len(found['inputs'])):\n        found['details'][i] = True\n"
         "    found['progress'].value = len(found['inputs'])\n    os._exit(0)\n",
         True, strict_verdict=False),
    # ---- python_tests: the program and its tests in one interpreter (issue 21) ----------------
    Case("eq_always_true_in_the_tests", "python_tests",
         "class Anything:\n    def __eq__(self, other):\n        return True\n"
         "def identity(x):\n    return Anything()\n", True, strict_verdict=False),
    Case("read_expected_from_the_callers_frame", "python_tests",
         "import sys\ndef identity(x):\n    frame = sys._getframe(1)\n"
         "    line = open(frame.f_code.co_filename).read().splitlines()[frame.f_lineno - 1]\n"
         "    return eval(line.split('==')[1])\n", True, strict_verdict=False),
    Case("read_expected_from_check_py", "python_tests",
         "import glob, re\ndef identity(x):\n"
         "    for path in ['check.py'] + glob.glob('/proc/*/cwd/check.py') + glob.glob('/**/check.py'):\n"
         "        try:\n            found = re.findall(r'== (\\d+)', open(path).read())\n"
         "        except OSError:\n            continue\n"
         "        if found:\n            return int(found[-1])\n    return 0\n",
         True, strict_verdict=False),
    Case("read_the_tests_from_any_process_memory", "python_tests",
         "import os, re\ndef _search():\n    budget = 256 << 20\n"
         "    for pid in ['self'] + [p for p in os.listdir('/proc') if p.isdigit()]:\n"
         "        try:\n            maps = open(f'/proc/{pid}/maps').read().splitlines()\n"
         "            mem = open(f'/proc/{pid}/mem', 'rb', 0)\n        except OSError:\n"
         "            continue\n        for line in maps:\n"
         "            fields = line.split()\n"
         "            start, end = (int(v, 16) for v in fields[0].split('-'))\n"
         "            if 'r' not in fields[1] or end - start > budget:\n                continue\n"
         "            if len(fields) > 5 and fields[5].startswith('/'):\n"
         "                continue  # mapped files (the interpreter, libraries): code, not the tests\n"
         "            try:\n                mem.seek(start)\n                data = mem.read(end - start)\n"
         "            except (OSError, ValueError, OverflowError):\n                continue\n"
         "            budget -= end - start\n"
         "            found = re.search(rb'assert identity\\(3\\) == (\\d+)', data)\n"
         "            if found:\n                return int(found.group(1))\n"
         "    return 0\n"
         "def identity(x):\n    return _search()\n",
         None, strict_verdict=False, timeout=10.0),
    Case("forge_the_end_of_tests_token_from_memory", "python_tests",
         _FRAME + "import re\ncandidates = set()\nbudget = 64 << 20\n"
         "maps = open('/proc/self/maps').read().splitlines()\n"
         "with open('/proc/self/mem', 'rb', 0) as mem:\n    for line in maps:\n"
         "        start, end = (int(v, 16) for v in line.split()[0].split('-'))\n"
         "        if 'r' not in line.split()[1] or end - start > budget:\n            continue\n"
         "        try:\n            mem.seek(start)\n            data = mem.read(end - start)\n"
         "        except (OSError, ValueError, OverflowError):\n            continue\n"
         "        budget -= end - start\n"
         "        candidates.update(re.findall(rb'(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])', data))\n"
         "for token in sorted(candidates)[:1000]:\n    _write(3, token)\n    _write(3, _frame(token))\n"
         "_os._exit(0)\ndef identity(x):\n    return 0\n",
         True, strict_verdict=False, timeout=10.0),
    Case("shadow_a_builtin_the_tests_use", "python_tests",
         "def identity(x):\n    return 0\ndef int(text):\n    return 0\n", True,
         strict_verdict=False, tests="assert identity(3) == int('3')"),
    Case("sys_exit_zero_inside_the_call", "python_tests",
         "import sys\ndef identity(x):\n    sys.exit(0)\n", True, strict_verdict=False),
    Case("os_exit_zero_inside_the_call", "python_tests",
         "import os\ndef identity(x):\n    os._exit(0)\n", True, strict_verdict=False),
    # ---- aimed at strict python_tests' split: its channel and its test process ----------------
    Case("forged_replies_on_the_call_channel", "python_tests",
         _FRAME + "def identity(x):\n    for fd in range(3, 64):\n"
         "        for message in ({'verdict': 'pass'}, {'exit': 0}, {'ready': {}},\n"
         "                        *({'id': n, 'raise': ['SystemExit', '0']} for n in range(4)),\n"
         "                        *({'id': n, 'value': True, 'exit': 0} for n in range(4))):\n"
         "            _write(fd, _frame(message))\n    return 0\n", False, strict_verdict=False),
    Case("garbage_on_the_call_channel", "python_tests",
         _FRAME + "_write(3, b'\\xff' * 64)\ndef identity(x):\n    _write(3, b'not json at all')\n"
         "    return 0\n", False, strict_verdict=False),
    Case("huge_return_value", "python_tests",
         "def identity(x):\n    return 'x' * (96 << 20)\n", False, strict_verdict=False),
    Case("deeply_nested_return_value", "python_tests",
         _FRAME + "def identity(x):\n    _write(3, _frame(b'[' * 500000 + b']' * 500000))\n"
         "    value = []\n    for _ in range(200000):\n        value = [value]\n    return value\n",
         False, strict_verdict=False),
    Case("call_that_never_returns", "python_tests",
         "import time\ndef identity(x):\n    while True:\n        time.sleep(1)\n", False,
         strict_verdict=False),
    Case("kill_the_test_process", "python_tests",
         "import os, signal, time\ndef _kill_the_others():\n    for _ in range(50):\n"
         "        for pid in os.listdir('/proc'):\n"
         "            if pid.isdigit() and int(pid) not in (os.getpid(), os.getppid(), 1):\n"
         "                for sig in (signal.SIGKILL, signal.SIGSTOP):\n"
         "                    try:\n                        os.kill(int(pid), sig)\n"
         "                    except OSError:\n                        pass\n"
         "        time.sleep(0.01)\n"
         "if os.fork() == 0:\n    _kill_the_others()\n    os._exit(0)\n"
         "def identity(x):\n    _kill_the_others()\n    return 0\n", False, strict_verdict=False),
    Case("print_the_verdict_line", "python_tests",
         _FRAME + "import sys\nfor fd in (1, 2, 3):\n"
         "    _write(fd, b'0\\n{\"status\": \"pass\"}\\n{\"verdict\": [true, null]}\\nPASSED\\n')\n"
         "print('{\"status\": \"pass\"}')\nprint('1 passed, 0 failed', file=sys.stderr)\n"
         "def identity(x):\n    print('ok')\n    return 0\n", False, strict_verdict=False),
]


def render(program: str, values: dict) -> str:
    for key, value in values.items():
        program = program.replace("{" + key + "}", str(value))
    return program
