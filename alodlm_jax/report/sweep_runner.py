"""The model-backed sweep point: the evaluate command's generate-mode flow, one model for all points.

:class:`EvaluationPointRunner` evaluates one grid point with ``alodlm_scoring.evaluation`` (output
directory preparation and ``--resume``, ordered scoring, ``predictions.jsonl`` and ``summary.json``)
— the same functions ``alodlm-jax-evaluate`` strings together, so a sweep point's directory is what
``alodlm-jax-evaluate --q ... --tau ... --mode ...`` would write (SCORING.md §6.2, §6.4, §7).

:class:`SharedModelGenerators` loads the weights and tokenizer once (on the first point that needs
generating: a fully complete sweep loads nothing) and gives each point a ``Generator`` built over
the same parameter arrays with that point's decoding configuration. Each point's engine compiles
its own programs during its warmup (the decoding configuration is part of what is compiled), and
that compile time lands in the point's ``protocol.compile_seconds``; it is never inside the timed
``wall_seconds``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from alodlm_jax.config import ENGINE_NAMES, DecodeConfig

from .sweep import SweepPoint

__all__ = ["EvaluationPointRunner", "SharedModelGenerators"]

_PROTOCOL_FIELDS_FROM_GENERATOR = ("decoder", "precision", "device", "gpu", "device_kind",
                                   "compile_seconds")

# A generator as the evaluate flow uses it: .check_prompt(prompt), .warmup(prompt),
# .generate(prompt) -> result dict, .protocol_fields() -> dict.
GeneratorFactory = Callable[[DecodeConfig], Any]


class SharedModelGenerators:
    """``factory(decode_config) -> Generator``; the model is loaded on the first call only."""

    def __init__(self, model: str, *, precision: str = "fp32", device: str = "cpu",
                 engine: str = "portable", model_config: str | None = None,
                 compilation_cache_dir: str | None = None) -> None:
        self.model = model
        self.precision = precision
        self.device = device
        self.engine = engine
        self.model_config = model_config
        self.compilation_cache_dir = compilation_cache_dir
        self._base = None
        self.loads = 0  # how many times weights were read (1 for any sweep that generates)

    def __call__(self, decode: DecodeConfig):
        from alodlm_jax import generate as generation

        if self._base is None:
            self._base = generation.build_generator(
                model=self.model, model_config=self.model_config, device=self.device,
                precision=self.precision, decode_config=decode, engine=self.engine,
                compilation_cache_dir=self.compilation_cache_dir)
            self.loads += 1
            return self._base
        base = self._base
        if base.decode_config == decode:
            return base
        return base.with_decode_config(decode)


@dataclasses.dataclass
class EvaluationPointRunner:
    """Runs one sweep point through the evaluation flow (a :class:`~.sweep.PointRunner`).

    ``fixed_protocol`` holds decoder, precision and device as the evaluate command records them;
    the generator's own ``protocol_fields()`` may refine them (gpu, device_kind, compile_seconds).
    Use as a context manager so the code-scoring worker pool, shared by all points, is closed.
    """

    tasks: Sequence[Mapping[str, Any]]
    input_sha256: str
    generators: GeneratorFactory
    base: DecodeConfig
    fixed_protocol: Mapping[str, Any]
    workers: int | None = None
    code_sandbox: str = "on"
    code_verdicts: str = "reference"
    progress_factory: Callable[[SweepPoint], Any] | None = None
    settings_for: Callable[[SweepPoint], Any] | None = None  # the point's run record settings
    _pool: Any = None
    _prompts_checked: bool = False

    def __enter__(self) -> "EvaluationPointRunner":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close(kill=exc_info[0] is not None)

    def close(self, kill: bool = False) -> None:
        if self._pool is not None:
            self._pool.close(kill=kill)
            self._pool = None

    def _scoring_pool(self):
        if self._pool is None:
            from alodlm_scoring.pool import ScoringPool

            # Workers start on the first code task.
            self._pool = ScoringPool(self.workers, sandbox=self.code_sandbox,
                                     rules=self.code_verdicts)
        return self._pool

    def __call__(self, point: SweepPoint, directory: str, resume: bool) -> Mapping[str, Any]:
        from alodlm_scoring import evaluation, outputs

        state = evaluation.prepare_output_directory(directory, resume=resume)
        decode = point.decode_config(self.base)
        generator = self.generators(decode)
        tasks = self.tasks
        if len(state.existing_lines) < len(tasks):
            if not self._prompts_checked:  # every point has the same prompts and budget
                from alodlm_jax.generate import check_task_prompts

                check_task_prompts(generator, tasks)
                self._prompts_checked = True
            generator.warmup(tasks[0]["prompt"])  # §6.4: compile before anything is timed

        def rows(start: int):
            for task in tasks[start:]:
                yield generator.generate(task["prompt"])

        def make_protocol(failures):
            fields = dict(self.fixed_protocol)
            supplied = generator.protocol_fields() or {}
            fields.update({k: v for k, v in supplied.items()
                           if k in _PROTOCOL_FIELDS_FROM_GENERATOR})
            return outputs.protocol_block(
                input_sha256=self.input_sha256, decode=decode.as_dict(),
                timing=outputs.GENERATE_TIMING, scoring_failures=failures, **fields)

        progress = self.progress_factory(point) if self.progress_factory else None
        settings = self.settings_for(point) if self.settings_for else None
        return evaluation.evaluate(tasks, state, rows_source=rows, make_protocol=make_protocol,
                                   progress=progress, pool=self._scoring_pool(), settings=settings)

    def check_point(self, point: SweepPoint, directory: str) -> None:
        """Refuse a point directory that another run's settings wrote (``run_sweep``'s
        ``check_point``): its run record must bind this point's settings."""
        from alodlm_scoring import evaluation, run_record

        if self.settings_for is None:
            return
        state = evaluation.prepare_output_directory(directory, resume=True)
        run_record.check(state.record_path, self.settings_for(point), has_rows=state.has_rows)


def fixed_protocol_fields(engine: str, precision: str, device: str) -> dict[str, Any]:
    """What the evaluate command records before asking the generator (decoder, precision, device)."""
    return {"decoder": ENGINE_NAMES[engine], "precision": precision, "device": device}
