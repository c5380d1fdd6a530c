"""alodlm_scoring: framework-agnostic task loading and scoring for alodlm-jax.

Submodules: ``tasks`` (load and validate the task file), ``extract`` (answer and program
extraction), ``metrics`` (the ``score`` dispatcher and the metric implementations), ``errors``.

This package must never import jax, flax or torch, directly or indirectly: code-scoring workers
import it in fresh interpreters. It also avoids importing math-verify and evalplus until they are
needed, so ``import alodlm_scoring`` stays cheap. ``score`` and ``load_tasks`` are re-exported
lazily.
"""

__all__ = ["score", "load_tasks"]


def __getattr__(name):
    if name == "score":
        from .metrics import score

        return score
    if name == "load_tasks":
        from .tasks import load_tasks

        return load_tasks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
