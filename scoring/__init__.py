"""alodlm_scoring: framework-agnostic task loading and scoring for alodlm-jax.

Submodules: ``tasks`` (load and validate the task file), ``extract`` (answer and program
extraction), ``metrics`` (the ``score`` dispatcher and the metric implementations), ``errors``,
``pool`` (the pool of fresh-interpreter scoring workers), ``sandbox`` (the code sandbox),
``strict`` and ``plaindata`` (the strict verdict rules), ``scorer`` (:class:`Scorer`).

:class:`Scorer` is the library call for untrusted code (a training loop's rewards): code runs in
the pool's sandboxed workers, under the reference's or the strict rules. ``score`` is the
in-process dispatcher the workers use; it runs code metrics' programs in plain child processes
of the calling process (no sandbox) unless given a sandbox.

This package must never import jax, flax or torch, directly or indirectly: code-scoring workers
import it in fresh interpreters. It also avoids importing math-verify and evalplus until they are
needed, so ``import alodlm_scoring`` stays cheap. ``score`` and ``load_tasks`` are re-exported
lazily.
"""

__all__ = ["score", "load_tasks", "Scorer"]


def __getattr__(name):
    if name == "score":
        from .metrics import score

        return score
    if name == "Scorer":
        from .scorer import Scorer

        return Scorer
    if name == "load_tasks":
        from .tasks import load_tasks

        return load_tasks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
