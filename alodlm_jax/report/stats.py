"""The numbers behind each figure, accumulated while the prediction rows stream past.

Generate-mode rows carry the decoder's statistics (``exit_depths``, ``first_pass_halt_probabilities``,
``outer_steps``, ``recurrent_passes``, ``loop_token_passes``; SCORING.md §7.1); rescored rows may
carry only ``text``, ``generated_tokens`` and ``wall_seconds``. Each statistic therefore counts how
many rows supplied it, so the report can skip a figure with a reason instead of drawing an empty
or misleading one. Per-token lists are reduced on the fly (depth counts, fixed-bin hazard
histograms), so memory does not grow with the generation length.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Any, Iterable, Mapping

import numpy as np

from alodlm_scoring.errors import PredictionFileError
from alodlm_scoring.predictions import REPORT_FIELDS, check_fields

from .loading import iter_prediction_rows, predictions_path

__all__ = ["HALT_BINS", "RunStats", "StatsAccumulator", "collect_run_stats", "collect_rows"]

# Bin edges of the first-pass halting-probability histogram: 20 equal bins on [0, 1].
HALT_BINS = np.linspace(0.0, 1.0, 21)


@dataclasses.dataclass(frozen=True)
class RunStats:
    """Everything the figures of one run need, reduced from ``predictions.jsonl``.

    ``*_rows`` fields count the rows that supplied a statistic (0 → the figure is skipped).
    Benchmark-keyed mappings are sorted by name, as ``summary.json``'s benchmarks are.
    """

    rows: int
    exit_depth_counts: Mapping[str, Mapping[int, int]]  # benchmark -> depth -> tokens
    exit_depth_rows: int
    halt_histograms: Mapping[str, np.ndarray]  # benchmark -> counts over HALT_BINS
    halt_rows: int
    passes_per_window: tuple[float, ...]  # per task: recurrent_passes / outer_steps
    tokens_per_window: tuple[float, ...]  # per task: generated_tokens / outer_steps
    window_rows: int  # rows with outer_steps > 0 and recurrent_passes
    loop_token_passes: int  # Σ loop_token_passes over rows that report it
    loop_generated_tokens: int  # Σ generated_tokens over those same rows
    loop_rows: int

    @property
    def loop_token_passes_per_output_token(self) -> float | None:
        """Σ passes / Σ output tokens (a ratio of sums, like the suite's tokens per second)."""
        if not self.loop_rows or not self.loop_generated_tokens:
            return None
        return self.loop_token_passes / self.loop_generated_tokens

    @property
    def mean_exit_depth(self) -> float | None:
        tokens = sum(n for counts in self.exit_depth_counts.values() for n in counts.values())
        if not tokens:
            return None
        depth_sum = sum(d * n for counts in self.exit_depth_counts.values()
                        for d, n in counts.items())
        return depth_sum / tokens


class StatsAccumulator:
    """Feeds rows one at a time; :meth:`result` freezes the totals into a :class:`RunStats`.

    Each row is checked with the prediction-file rules of ``alodlm_scoring.predictions``
    (:data:`~alodlm_scoring.predictions.REPORT_FIELDS`); the errors name file, line and field.
    """

    def __init__(self, file: str = "predictions.jsonl") -> None:
        self.file = file
        self.rows = 0
        self.depths: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.depth_rows = 0
        self.halts: dict[str, np.ndarray] = {}
        self.halt_rows = 0
        self.passes_per_window: list[float] = []
        self.tokens_per_window: list[float] = []
        self.loop_passes = 0
        self.loop_tokens = 0
        self.loop_rows = 0

    def _missing(self, line: int, field: str, because: str) -> PredictionFileError:
        return PredictionFileError(f"missing required field ({because})",
                                   file=self.file, line=line, field=field)

    def add(self, line: int, row: Mapping[str, Any]) -> None:
        check_fields(row, REPORT_FIELDS, file=self.file, line=line)  # the types of every field
        self.rows += 1
        benchmark = row["benchmark"]
        depths = row.get("exit_depths")
        if depths is not None:
            self.depths[benchmark].update(depths)
            self.depth_rows += 1
        halts = row.get("first_pass_halt_probabilities")
        if halts is not None:
            values = np.clip(np.asarray(halts, dtype=np.float64), 0.0, 1.0)
            counts, _ = np.histogram(values, bins=HALT_BINS)
            if benchmark in self.halts:
                self.halts[benchmark] += counts
            else:
                self.halts[benchmark] = counts.astype(np.int64)
            self.halt_rows += 1
        steps, passes = row.get("outer_steps"), row.get("recurrent_passes")
        tokens = row.get("generated_tokens")
        if steps is not None or passes is not None:
            if steps is None:
                raise self._missing(line, "outer_steps", "the row has recurrent_passes")
            if passes is None:
                raise self._missing(line, "recurrent_passes", "the row has outer_steps")
            if steps > 0:  # a generation that stopped at once has no windows to average over
                self.passes_per_window.append(passes / steps)
                if tokens is not None:
                    self.tokens_per_window.append(tokens / steps)
        loop = row.get("loop_token_passes")
        if loop is not None:
            if tokens is None:
                raise self._missing(line, "generated_tokens", "the row has loop_token_passes")
            self.loop_passes += loop
            self.loop_tokens += tokens
            self.loop_rows += 1

    def result(self) -> RunStats:
        return RunStats(
            rows=self.rows,
            exit_depth_counts={b: dict(sorted(self.depths[b].items()))
                               for b in sorted(self.depths)},
            exit_depth_rows=self.depth_rows,
            halt_histograms={b: self.halts[b] for b in sorted(self.halts)},
            halt_rows=self.halt_rows,
            passes_per_window=tuple(self.passes_per_window),
            tokens_per_window=tuple(self.tokens_per_window),
            window_rows=len(self.passes_per_window),
            loop_token_passes=self.loop_passes,
            loop_generated_tokens=self.loop_tokens,
            loop_rows=self.loop_rows,
        )


def collect_run_stats(directory: str | os.PathLike) -> RunStats:
    """Stream ``predictions.jsonl`` of ``directory`` into a :class:`RunStats` (empty if absent)."""
    accumulator = StatsAccumulator(predictions_path(directory))
    for line, row in iter_prediction_rows(directory):
        accumulator.add(line, row)
    return accumulator.result()


def collect_rows(rows: Iterable[Mapping[str, Any]]) -> RunStats:
    """:func:`collect_run_stats` for rows already in memory (tests, notebooks)."""
    accumulator = StatsAccumulator("<rows>")
    for line, row in enumerate(rows, start=1):
        accumulator.add(line, row)
    return accumulator.result()
