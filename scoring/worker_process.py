"""The evaluator's side of one scoring worker (:mod:`alodlm_scoring.pool` runs several): its
fresh-interpreter process, its scratch directory, and the checked verdict channel (a fresh nonce
per request, one well-formed JSON line per reply, nothing outside a request); the other side is
:mod:`alodlm_scoring.worker`."""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Mapping, Sequence

__all__ = ["WorkerProcess", "WorkerError", "WorkerTimeout", "WorkerDied", "ProtocolViolation",
           "WORKER_MODULE"]

# A reply line longer than this is not a verdict (extracted strings are bounded by the text).
_MAX_REPLY_BYTES = 64 * 1024**2
WORKER_MODULE = "alodlm_scoring.worker"
_READY_TIMEOUT_SECONDS = 120.0
_FAILURE_PREFIX = "Isolated code scoring failed: "


class WorkerError(RuntimeError):
    """A worker reported an exception: fatal, "Isolated code scoring failed: " + traceback."""

    def __init__(self, traceback_text: str, error_type: str | None = None,
                 message: str | None = None) -> None:
        self.traceback_text = traceback_text
        self.error_type = error_type
        self.error_message = message
        super().__init__(_FAILURE_PREFIX + traceback_text)

    def summary_line(self) -> str:
        """One line for the command line: the prefix plus the worker's final exception line."""
        if self.error_type is not None:
            return f"{_FAILURE_PREFIX}{self.error_type}: {self.error_message}"
        last = [line for line in self.traceback_text.strip().splitlines() if line.strip()]
        return _FAILURE_PREFIX + (last[-1].strip() if last else "worker failed")



class WorkerTimeout(Exception):
    pass


class WorkerDied(Exception):
    pass


class ProtocolViolation(Exception):
    """The worker's channel carried something that is not the worker's reply."""


class WorkerProcess:
    """One worker process plus its scratch directory (its TMPDIR and working directory)."""

    def __init__(self, scratch_root: str, env: Mapping[str, str], arguments: Sequence[str]) -> None:
        self.directory = tempfile.mkdtemp(prefix="worker-", dir=scratch_root)
        self._stderr_path = os.path.join(self.directory, "worker.stderr")
        env = dict(env)
        env["TMPDIR"] = self.directory
        env["ALODLM_WORKER_SCRATCH"] = self.directory
        with open(self._stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE, *arguments],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=self.directory,
                env=env,
                start_new_session=True,
            )
        self._buffer = b""
        self._ready = False
        self._startup_error: WorkerError | None = None
        self.sandbox: dict | None = None  # the worker's greeting's description

    # -- protocol ------------------------------------------------------------------------------

    def _read_line(self, deadline: float) -> bytes:
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            if len(self._buffer) > _MAX_REPLY_BYTES:
                raise ProtocolViolation("a reply longer than the limit")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerTimeout()
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                raise WorkerTimeout()
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise WorkerDied()
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _await_ready(self) -> None:
        if self._ready:
            return
        if self._startup_error is not None:  # a worker that failed to start stays failed
            raise self._startup_error
        try:
            line = self._read_line(time.monotonic() + _READY_TIMEOUT_SECONDS)
            greeting = json.loads(line)
            if type(greeting) is not dict or greeting.get("ready") is not True:
                raise ValueError
        except (WorkerTimeout, WorkerDied):
            self._startup_error = WorkerError(
                "the scoring worker did not start: " + self.stderr_text().strip())
        except (ProtocolViolation, ValueError):
            self._startup_error = WorkerError(
                f"unexpected scoring worker greeting {self._buffer[:200]!r}")
        else:
            self.sandbox = greeting.get("sandbox")
        if self._startup_error is not None:
            self.kill()
            raise self._startup_error
        self._ready = True

    def _stray_data(self) -> bool:
        """Whether anything arrived that no request asked for (written by a program that
        reached the channel): the worker can no longer be trusted."""
        if self._buffer:
            return True
        readable, _, _ = select.select([self.process.stdout.fileno()], [], [], 0)
        return bool(readable)

    def request(self, fields: Mapping[str, Any], timeout: float) -> dict:
        """Send one request (``fields`` plus a fresh nonce) and return its reply object;
        raises WorkerTimeout, WorkerDied or ProtocolViolation."""
        deadline = time.monotonic() + timeout
        self._await_ready()
        if self._stray_data():
            raise ProtocolViolation("data arrived between requests")
        nonce = secrets.token_hex(16)
        payload = json.dumps({"nonce": nonce, **fields})
        try:
            self.process.stdin.write(payload.encode("utf-8") + b"\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDied() from None
        line = self._read_line(deadline)
        try:
            reply = json.loads(line)
        except ValueError:
            raise ProtocolViolation(f"a reply that is not JSON ({line[:60]!r})") from None
        if type(reply) is not dict or reply.get("nonce") != nonce:
            raise ProtocolViolation("a reply without this request's nonce")
        if self._buffer:
            raise ProtocolViolation("a second reply")
        return reply

    def stderr_text(self) -> str:
        try:
            with open(self._stderr_path, "rb") as handle:
                return handle.read()[-20000:].decode("utf-8", "replace")
        except OSError:
            return ""

    # -- lifetime ------------------------------------------------------------------------------

    def kill(self) -> None:
        """Kill the worker, its process group and every descendant, then clean its directory."""
        process = self.process
        descendants = []
        try:
            import psutil

            descendants = psutil.Process(process.pid).children(recursive=True)
        except Exception:  # psutil missing, or the worker is already gone
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for child in descendants:
            try:
                child.kill()
            except Exception:
                pass
        try:
            process.kill()
        except ProcessLookupError:
            pass
        process.wait()
        self._close_pipes()
        shutil.rmtree(self.directory, ignore_errors=True)

    def close(self) -> None:
        """Ask the worker to exit (end of input); kill it if it lingers."""
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def _close_pipes(self) -> None:
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:
                pass

