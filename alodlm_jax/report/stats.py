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
import math
import os
from typing import Any, Iterable, Mapping

import numpy as np

from .loading import ReportInputError, iter_prediction_rows, predictions_path

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


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class StatsAccumulator:
    """Feeds rows one at a time; :meth:`result` freezes the totals into a :class:`RunStats`."""

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

    def _bad(self, line: int, field: str, what: str) -> ReportInputError:
        return ReportInputError(what, file=self.file, line=line, field=field)

    def add(self, line: int, row: Mapping[str, Any]) -> None:
        self.rows += 1
        benchmark = row["benchmark"]
        depths = row.get("exit_depths")
        if depths is not None:
            if not isinstance(depths, list) or not all(_count(d) for d in depths):
                raise self._bad(line, "exit_depths", "must be a list of non-negative integers")
            self.depths[benchmark].update(depths)
            self.depth_rows += 1
        halts = row.get("first_pass_halt_probabilities")
        if halts is not None:
            if not isinstance(halts, list) or not all(_number(h) for h in halts):
                raise self._bad(line, "first_pass_halt_probabilities",
                                "must be a list of finite numbers")
            values = np.clip(np.asarray(halts, dtype=np.float64), 0.0, 1.0)
            counts, _ = np.histogram(values, bins=HALT_BINS)
            if benchmark in self.halts:
                self.halts[benchmark] += counts
            else:
                self.halts[benchmark] = counts.astype(np.int64)
            self.halt_rows += 1
        steps, passes = row.get("outer_steps"), row.get("recurrent_passes")
        if steps is not None or passes is not None:
            if not _count(steps):
                raise self._bad(line, "outer_steps", "must be a non-negative integer")
            if not _count(passes):
                raise self._bad(line, "recurrent_passes", "must be a non-negative integer")
            tokens = row.get("generated_tokens")
            if steps > 0:  # a generation that stopped at once has no windows to average over
                self.passes_per_window.append(passes / steps)
                if _count(tokens):
                    self.tokens_per_window.append(tokens / steps)
        loop = row.get("loop_token_passes")
        if loop is not None:
            tokens = row.get("generated_tokens")
            if not _count(loop):
                raise self._bad(line, "loop_token_passes", "must be a non-negative integer")
            if not _count(tokens):
                raise self._bad(line, "generated_tokens", "must be a non-negative integer")
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
