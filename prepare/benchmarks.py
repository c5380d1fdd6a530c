"""The eleven benchmarks of the evaluation guide: metric, default source, columns, template.

``--benchmark`` takes exactly these names, case-insensitively; a row's ``benchmark`` is the name as
the guide writes it and its ``metric`` the guide's (SCORING.md §1).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from . import choices, problems, programs

__all__ = ["Benchmark", "BENCHMARKS", "lookup"]


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One benchmark.

    ``hub`` is the default source ``(dataset id, config, split)``; EvalPlus sets have ``release``
    (``HumanEvalPlus`` or ``MbppPlus``) instead. ``layouts`` lists the column sets the builder
    accepts (the first one a source has is used); ``builder`` turns the rows into items;
    ``shot`` (GSM8K only) turns a training row into a few-shot example for ``--fewshot``.
    """

    name: str
    metric: str
    template: str
    layouts: tuple[tuple[str, ...], ...]
    builder: Callable
    hub: tuple[str, str | None, str] | None = None
    release: str | None = None
    shot: Callable | None = None

    @property
    def default_split(self) -> str | None:
        return self.hub[2] if self.hub else None


_MC = "multiple_choice.jinja"
_ARC_COLUMNS = (("id", "question", "choices", "answerKey"),)
_EVALPLUS_COLUMNS = ("task_id", "prompt", "canonical_solution", "entry_point", "base_input", "atol")

BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("ARC-C", "arc", _MC, _ARC_COLUMNS, choices.arc_items,
              hub=("allenai/ai2_arc", "ARC-Challenge", "test")),
    Benchmark("ARC-E", "arc", _MC, _ARC_COLUMNS, choices.arc_items,
              hub=("allenai/ai2_arc", "ARC-Easy", "test")),
    Benchmark("MMLU", "mmlu", _MC, (("question", "subject", "choices", "answer"),),
              choices.mmlu_items, hub=("cais/mmlu", "all", "test")),
    Benchmark("MMLU-Pro", "mmlu_pro", _MC,
              (("question_id", "question", "options", "answer", "answer_index"),),
              choices.mmlu_pro_items, hub=("TIGER-Lab/MMLU-Pro", None, "test")),
    Benchmark("GPQA-Diamond", "gpqa", _MC, (("Record ID", "Question") + choices.GPQA_ANSWER_COLUMNS,),
              choices.gpqa_items, hub=("Idavidrein/gpqa", "gpqa_diamond", "train")),
    Benchmark("GSM8K", "math", "math.jinja", (("question", "answer"),), problems.gsm8k_items,
              hub=("openai/gsm8k", "main", "test"), shot=problems.gsm8k_shot),
    Benchmark("MATH-500", "math", "math.jinja", (("problem", "answer", "unique_id"),),
              problems.math500_items, hub=("HuggingFaceH4/MATH-500", None, "test")),
    Benchmark("MBPP", "python_tests", "mbpp.jinja",
              (("task_id", "text", "test_list", "test_setup_code"),
               ("task_id", "prompt", "test_list", "test_imports")),
              programs.mbpp_items, hub=("google-research-datasets/mbpp", "full", "test")),
    Benchmark("MBPP+", "evalplus", "evalplus.jinja", (_EVALPLUS_COLUMNS + ("plus_input",),),
              programs.mbpp_plus_items, release="MbppPlus"),
    Benchmark("HumanEval", "evalplus", "evalplus.jinja", (_EVALPLUS_COLUMNS,),
              programs.humaneval_items, release="HumanEvalPlus"),
    Benchmark("HumanEval+", "evalplus", "evalplus.jinja", (_EVALPLUS_COLUMNS + ("plus_input",),),
              programs.humaneval_plus_items, release="HumanEvalPlus"),
)

_BY_NAME = {benchmark.name.lower(): benchmark for benchmark in BENCHMARKS}


def lookup(names: Sequence[str]) -> list[Benchmark]:
    """The benchmarks named (case-insensitive, in the order given, each once); else ValueError."""
    chosen: list[Benchmark] = []
    for name in names:
        benchmark = _BY_NAME.get(name.strip().lower())
        if benchmark is None:
            raise ValueError(f"--benchmark: unknown benchmark {name.strip()!r}; choose from "
                             + ", ".join(b.name for b in BENCHMARKS))
        if benchmark in chosen:
            raise ValueError(f"--benchmark: {benchmark.name} is named twice")
        chosen.append(benchmark)
    if not chosen:
        raise ValueError("--benchmark: name at least one benchmark")
    return chosen
