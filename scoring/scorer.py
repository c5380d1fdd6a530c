"""``Scorer``: the evaluator's scoring as a library call (rewards in a training loop, scripts).

    from alodlm_scoring import Scorer

    with Scorer(workers=4, verdicts="strict") as scorer:
        correct, extracted = scorer.score(task_record, generated_text)
        futures = [scorer.submit(task, text) for task, text in batch]

Code metrics run in the evaluator's pool of fresh-interpreter workers inside the code sandbox
(``sandbox="on"``, the default), so this is safe to call from a process that has JAX or PyTorch
loaded and from any thread. Other metrics are scored in this process when called from its main
thread (math-verify's timeouts need ``SIGALRM``) and in the pool otherwise. A task whose program
timed out, killed its worker or broke the verdict channel scores ``(False, None)``;
:meth:`Scorer.outcome` also gives the reason.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Mapping

from .pool import Outcome, ScoringPool, is_code_task

__all__ = ["Scorer"]


class Scorer:
    """Score ``(record, generation)`` pairs with the evaluate command's scorer and sandbox."""

    def __init__(self, workers: int | None = None, *, sandbox: str = "on",
                 verdicts: str = "reference") -> None:
        self._pool = ScoringPool(workers, sandbox=sandbox, rules=verdicts)
        self.verdicts = verdicts

    @property
    def code_sandbox(self) -> dict:
        """The sandbox's mode, the mechanisms in force and those missing on this machine."""
        return self._pool.code_sandbox

    def outcome(self, record: Mapping[str, Any], generation: str) -> Outcome:
        """The verdict with its failure reason (``None`` unless forced incorrect)."""
        return self._submit(record, generation).result()

    def score(self, record: Mapping[str, Any], generation: str) -> tuple[bool, str | None]:
        """``(correct, extracted)``, as ``predictions.jsonl`` records them."""
        outcome = self.outcome(record, generation)
        return outcome.correct, outcome.extracted

    def submit(self, record: Mapping[str, Any], generation: str) -> concurrent.futures.Future:
        """Queue one pair; the future yields ``(correct, extracted)``."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        inner = self._submit(record, generation)
        inner.add_done_callback(lambda done: _relay(done, future))
        return future

    def _submit(self, record: Mapping[str, Any], generation: str) -> concurrent.futures.Future:
        if is_code_task(record) or threading.current_thread() is not threading.main_thread():
            return self._pool.submit(record, generation)
        from .metrics import score

        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(Outcome(*score(record, generation)))
        except Exception as error:  # noqa: BLE001 - raised by .result(), as the pool's are
            future.set_exception(error)
        return future

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> "Scorer":
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.close(kill=exc[0] is not None)


def _relay(done: concurrent.futures.Future, future: concurrent.futures.Future) -> None:
    error = done.exception()
    if error is not None:
        future.set_exception(error)
    else:
        outcome = done.result()
        future.set_result((outcome.correct, outcome.extracted))
