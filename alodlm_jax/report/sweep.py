"""Quality-speed sweeps: a grid over q, tau and mode, one evaluation directory per point.

The sweep root holds::

    q0.5_tau0.4_entropy/        an ordinary evaluate output (predictions.jsonl, summary.json)
                                plus its report.html and figures
    ...
    sweep.json                  the grid and every point's headline numbers (rewritten after each
                                point, so an interrupted sweep still documents what finished)
    sweep_*.png, report.html    the frontiers (score vs tokens/s; score vs loop-token passes per
                                output token, as the ALoDLM paper's Figures 1 and 4) and an index
                                page linking every point's report

Resumable point by point: a point whose ``summary.json`` exists is skipped (after checking that
it was produced with this point's decoding configuration and the same task file); a point with
only ``predictions.jsonl`` is continued with the evaluate flow's resume; the rest run fresh.

How a point is evaluated is a :class:`PointRunner` — a callable ``(point, directory, resume) ->
summary``. :mod:`alodlm_jax.report.sweep_runner` supplies the model-backed one; tests supply a fake.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, TextIO

from alodlm_jax.config import MODES, DecodeConfig, DecodeConfigError
from alodlm_scoring.evaluation import make_directories, remove_directories

from .build import REPORT_FILE, build_run_report
from .loading import PREDICTIONS_FILE, SUMMARY_FILE, read_summary
from .stats import RunStats, collect_run_stats

__all__ = [
    "SWEEP_FILE",
    "SweepPoint",
    "PointRunner",
    "PointResult",
    "SweepResult",
    "parse_float_list",
    "parse_mode_list",
    "make_grid",
    "point_state",
    "run_sweep",
    "write_sweep_outputs",
    "pareto_front",
]

SWEEP_FILE = "sweep.json"
SWEEP_FORMAT = "alodlm-jax-sweep"
FRONTIER_FIGURES = (
    ("suite_tokens_per_second", "sweep_score_vs_tokens_per_second.png",
     "Score vs throughput", "suite tokens per second", True,
     "Macro score against the suite's generated tokens per second (wall time includes prefill). "
     "Lines join the q values of one (mode, tau); the grey dashed line is the Pareto front."),
    ("loop_token_passes_per_output_token", "sweep_score_vs_loop_passes.png",
     "Score vs loop work", "loop-token passes per output token", False,
     "Macro score against the loop-token passes per committed token (a hardware-independent cost: "
     "window rows times executed passes, summed, over output tokens). Lines join the q values of "
     "one (mode, tau); the grey dashed line is the Pareto front."),
)


def _number_text(value: float) -> str:
    """Shortest round-trip text of a float (``0.5``, ``1.0``, ``1e-05``) for directory names."""
    return repr(float(value))


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One grid point. Everything else in the decoding configuration is the sweep's base."""

    q: float
    tau: float
    mode: str

    @property
    def name(self) -> str:
        return f"q{_number_text(self.q)}_tau{_number_text(self.tau)}_{self.mode}"

    def decode_config(self, base: DecodeConfig) -> DecodeConfig:
        """``base`` with this point's q, tau and mode (validated by DecodeConfig)."""
        return dataclasses.replace(base, q=float(self.q), tau=float(self.tau), mode=self.mode)


class PointRunner(Protocol):
    def __call__(self, point: SweepPoint, directory: str, resume: bool) -> Mapping[str, Any]:
        """Evaluate ``point`` into ``directory`` (continuing a partial run when ``resume``) and
        return its summary (the content of ``summary.json``)."""


@dataclasses.dataclass(frozen=True)
class PointResult:
    point: SweepPoint
    directory: str
    status: str  # "ran" | "resumed" | "skipped" (already complete)
    summary: Mapping[str, Any]
    stats: RunStats


@dataclasses.dataclass(frozen=True)
class SweepResult:
    root: str
    points: tuple[PointResult, ...]
    sweep_json: str
    html_path: str
    figure_paths: tuple[str, ...]


# --------------------------------------------------------------------------------------------
# The grid
# --------------------------------------------------------------------------------------------


def parse_float_list(text: str | Iterable[Any], flag: str) -> tuple[float, ...]:
    """``"0.3,0.5"`` (or a list of strings/numbers) as distinct finite floats, in the given order."""
    items = text.split(",") if isinstance(text, str) else list(text)
    values: list[float] = []
    for item in items:
        raw = str(item).strip()
        if not raw:
            raise ValueError(f"--{flag}: empty value in {text!r}")
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"--{flag}: {raw!r} is not a number") from None
        if not math.isfinite(value):
            raise ValueError(f"--{flag}: {raw!r} is not finite")
        if value in values:
            raise ValueError(f"--{flag}: {raw!r} is listed twice")
        values.append(value)
    if not values:
        raise ValueError(f"--{flag}: no values")
    return tuple(values)


def parse_mode_list(text: str | Iterable[str]) -> tuple[str, ...]:
    items = text.split(",") if isinstance(text, str) else list(text)
    modes: list[str] = []
    for item in items:
        mode = str(item).strip()
        if mode not in MODES:
            raise ValueError(f"--mode: {mode!r} is not one of {', '.join(MODES)}")
        if mode in modes:
            raise ValueError(f"--mode: {mode!r} is listed twice")
        modes.append(mode)
    if not modes:
        raise ValueError("--mode: no values")
    return tuple(modes)


def make_grid(qs: Sequence[float], taus: Sequence[float], modes: Sequence[str],
              base: DecodeConfig) -> tuple[SweepPoint, ...]:
    """Every (mode, tau, q) combination, mode-major then tau then q, each validated up front so a
    bad value fails before any model is loaded."""
    points = tuple(SweepPoint(q, tau, mode) for mode in modes for tau in taus for q in qs)
    for point in points:
        try:
            point.decode_config(base)
        except DecodeConfigError as error:
            raise DecodeConfigError(f"grid point {point.name}: {error}", field=error.field) from None
    return points


def point_state(directory: str) -> str:
    """``"complete"`` (summary.json exists), ``"partial"`` (only predictions.jsonl) or ``"fresh"``."""
    if os.path.exists(os.path.join(directory, SUMMARY_FILE)):
        return "complete"
    if os.path.exists(os.path.join(directory, PREDICTIONS_FILE)):
        return "partial"
    return "fresh"


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


def _check_complete_point(directory: str, summary: Mapping[str, Any],
                          expected_decode: Mapping[str, Any] | None,
                          input_sha256: str | None) -> None:
    """A completed point is reused only if it is what this sweep would have produced."""
    protocol = summary.get("protocol") or {}
    where = os.path.join(directory, SUMMARY_FILE)
    if expected_decode is not None and protocol.get("decode") != dict(expected_decode):
        raise ValueError(f"{where}: was produced with decode {protocol.get('decode')!r}, not this "
                         f"sweep's {dict(expected_decode)!r}; use a fresh --output or remove the "
                         "point directory")
    if input_sha256 is not None and protocol.get("input_sha256") != input_sha256:
        raise ValueError(f"{where}: was produced from another task file (input_sha256 "
                         "differs); use a fresh --output")


def run_sweep(
    points: Sequence[SweepPoint],
    root: str | os.PathLike,
    runner: PointRunner,
    *,
    base: DecodeConfig,
    metadata: Mapping[str, Any] | None = None,
    input_sha256: str | None = None,
    check_decode: bool = True,
    reports: bool = True,
    log: TextIO | None = None,
    check_point: Callable[[SweepPoint, str], None] | None = None,
) -> SweepResult:
    """Evaluate every point not yet complete, then write sweep.json, frontiers and the index page.

    ``metadata`` (model, input, engine, …) is copied into sweep.json. With ``check_decode`` a
    complete point's ``protocol.decode`` must equal the point's decoding configuration, and with
    ``input_sha256`` its ``protocol.input_sha256`` must match. ``check_point(point, directory)``
    is called for every point that is not fresh, before any point runs (the runner's own check
    that it is the same run; it raises to refuse). A sweep directory this call creates is removed
    again if the call fails before anything is written in it.
    """
    root = os.fspath(root)
    log = log or sys.stderr
    names = [point.name for point in points]
    if len(set(names)) != len(names):
        raise ValueError("the grid has two points with the same directory name")
    if check_point is not None:  # every point a rerun would continue or reuse, before any work
        for point in points:
            directory = os.path.join(root, point.name)
            if point_state(directory) != "fresh":
                check_point(point, directory)
    created = make_directories(root)
    try:
        return _run_points(points, root, runner, base=base, metadata=metadata,
                           input_sha256=input_sha256, check_decode=check_decode, reports=reports,
                           log=log)
    except BaseException:
        remove_directories(created)  # a root this run made, while still empty
        raise


def _run_points(points, root, runner, *, base, metadata, input_sha256, check_decode, reports,
                log) -> SweepResult:
    done: list[PointResult] = []
    for index, point in enumerate(points, start=1):
        directory = os.path.join(root, point.name)
        state = point_state(directory)
        expected = point.decode_config(base).as_dict() if check_decode else None
        if state == "complete":
            summary = read_summary(directory)
            _check_complete_point(directory, summary, expected, input_sha256)
            status = "skipped"
            log.write(f"[{index}/{len(points)}] {point.name}: complete, skipped\n")
        else:
            status = "resumed" if state == "partial" else "ran"
            log.write(f"[{index}/{len(points)}] {point.name}: "
                      f"{'resuming' if state == 'partial' else 'evaluating'}\n")
            log.flush()
            runner(point, directory, state == "partial")
            summary = read_summary(directory)
        stats = collect_run_stats(directory)
        if reports and (status != "skipped" or not os.path.exists(
                os.path.join(directory, REPORT_FILE))):
            build_run_report(directory, title=f"Sweep point {point.name}")
        done.append(PointResult(point, directory, status, summary, stats))
        log.write(f"[{index}/{len(points)}] {point.name}: macro "
                  f"{summary['macro_score_percent']:.2f} %, "
                  f"{summary['suite_tokens_per_second']:.1f} tokens/s\n")
        log.flush()
        _write_sweep_json(root, points, done, metadata, base)
    return write_sweep_outputs(root, points, done, metadata, base)


# --------------------------------------------------------------------------------------------
# sweep.json, frontiers, index page
# --------------------------------------------------------------------------------------------


def _point_record(root: str, point: SweepPoint, result: PointResult | None) -> dict[str, Any]:
    record: dict[str, Any] = {"name": point.name, "directory": point.name, "q": point.q,
                              "tau": point.tau, "mode": point.mode}
    if result is None:
        record.update(status="pending", report=None)
        return record
    summary, stats = result.summary, result.stats
    report = os.path.join(result.directory, REPORT_FILE)
    record.update(
        status=result.status,
        report=f"{point.name}/{REPORT_FILE}" if os.path.exists(report) else None,
        macro_score_percent=summary["macro_score_percent"],
        suite_tokens_per_second=summary["suite_tokens_per_second"],
        suite_wall_seconds=summary["suite_wall_seconds"],
        loop_token_passes_per_output_token=stats.loop_token_passes_per_output_token,
        mean_exit_depth=stats.mean_exit_depth,
        decoder=(summary.get("protocol") or {}).get("decoder"),
        benchmarks={name: values["score_percent"]
                    for name, values in summary["benchmarks"].items()},
    )
    return record


def _sweep_document(root: str, points: Sequence[SweepPoint], done: Sequence[PointResult],
                    metadata: Mapping[str, Any] | None, base: DecodeConfig) -> dict[str, Any]:
    by_name = {result.point.name: result for result in done}
    return {
        "format": SWEEP_FORMAT,
        "metadata": dict(metadata or {}),
        "fixed_decode": {k: v for k, v in base.as_dict().items() if k not in ("q", "tau", "mode")},
        "grid": {
            "q": list(dict.fromkeys(p.q for p in points)),
            "tau": list(dict.fromkeys(p.tau for p in points)),
            "mode": list(dict.fromkeys(p.mode for p in points)),
        },
        "points": [_point_record(root, p, by_name.get(p.name)) for p in points],
    }


def _write_json(path: str, document: Mapping[str, Any]) -> None:
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(json.dumps(document, indent=2) + "\n")
    os.replace(temporary, path)


def _write_sweep_json(root, points, done, metadata, base) -> dict[str, Any]:
    document = _sweep_document(root, points, done, metadata, base)
    _write_json(os.path.join(root, SWEEP_FILE), document)
    return document


def pareto_front(xy: Sequence[tuple[float, float]], *, larger_x_better: bool) -> list[tuple[float, float]]:
    """The points no other point beats in both coordinates (larger y always better), sorted by x.

    With ``larger_x_better`` (throughput) a point survives if no point has x ≥ and y ≥ with one
    strict; otherwise (cost) smaller x is better.
    """
    sign = 1.0 if larger_x_better else -1.0
    ordered = sorted(xy, key=lambda p: (-sign * p[0], -p[1]))  # best x first, best y first on ties
    front, best_y = [], -math.inf
    for x, y in ordered:
        if y > best_y:
            front.append((x, y))
            best_y = y
    return sorted(front)


def _draw_frontier(records: Sequence[Mapping[str, Any]], key: str, xlabel: str,
                   larger_x_better: bool, path: str) -> None:
    from .figures import label_points, plt, save_figure

    usable = [r for r in records if r.get(key) is not None and r.get("macro_score_percent") is not None]
    figure, axes = plt.subplots(figsize=(7.5, 5.0))
    series: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    for record in usable:
        series.setdefault((record["mode"], record["tau"]), []).append(record)
    markers = {"entropy": "o", "left1": "s"}
    colors = plt.get_cmap("tab10").colors
    labels = []
    for index, ((mode, tau), members) in enumerate(sorted(series.items())):
        members = sorted(members, key=lambda r: r["q"])
        xs = [float(r[key]) for r in members]
        ys = [float(r["macro_score_percent"]) for r in members]
        color = colors[index % len(colors)]
        axes.plot(xs, ys, marker=markers.get(mode, "^"), color=color,
                  linewidth=1.2, markersize=6, label=f"{mode}, tau={tau:g}")
        labels += [(x, y, f"q={record['q']:g}", color) for record, x, y in zip(members, xs, ys)]
    front = pareto_front([(float(r[key]), float(r["macro_score_percent"])) for r in usable],
                         larger_x_better=larger_x_better)
    if len(front) > 1:
        axes.plot([p[0] for p in front], [p[1] for p in front], color="grey", linestyle="--",
                  linewidth=1, zorder=0, label="Pareto front")
    axes.set_xlabel(xlabel + ("  (higher is faster)" if larger_x_better else "  (lower is cheaper)"))
    axes.set_ylabel("macro score (%)")
    scores = [float(r["macro_score_percent"]) for r in usable]
    low, high = max(0.0, min(scores) - 5.0), min(100.0, max(scores) + 5.0)
    if high - low < 10.0:
        low, high = max(0.0, high - 10.0), max(high, 10.0)
    pad = 0.04 * (high - low)  # keep markers on the limits whole
    axes.set_ylim(low - pad, high + pad)
    axes.margins(x=0.12)  # room for the labels of the outermost points
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="best")
    axes.autoscale_view()
    label_points(axes, labels)
    save_figure(figure, path)


def write_sweep_outputs(root: str, points: Sequence[SweepPoint], done: Sequence[PointResult],
                        metadata: Mapping[str, Any] | None, base: DecodeConfig) -> SweepResult:
    """sweep.json, the frontier PNGs (those with data) and the index report.html."""
    from .html import sweep_page

    document = _write_sweep_json(root, points, done, metadata, base)
    records = document["points"]
    drawn, skipped, paths = [], [], []
    for key, filename, title, xlabel, larger_better, caption in FRONTIER_FIGURES:
        path = os.path.join(root, filename)
        if not any(r.get(key) is not None for r in records):
            reason = ("no point has loop-token pass counts (predictions without decoder "
                      "statistics)" if key.startswith("loop") else "no point is complete")
            skipped.append((title, reason))
            if os.path.exists(path):
                os.remove(path)
            continue
        _draw_frontier(records, key, xlabel, larger_better, path)
        drawn.append((filename, title, caption))
        paths.append(path)
    meta = document["metadata"]
    subtitle_parts = [f"{len(done)} of {len(points)} point(s) evaluated"]
    for label in ("model", "input", "engine", "precision", "device"):
        if meta.get(label):
            subtitle_parts.append(f"{label} {meta[label]}")
    subtitle_parts.append(", ".join(f"{k}={v}" for k, v in document["fixed_decode"].items()))
    page = sweep_page(title=f"Sweep: {os.path.basename(os.path.abspath(root))}",
                      subtitle="; ".join(subtitle_parts), points=records, figures=drawn,
                      skipped=skipped, image_dir=root)
    html_path = os.path.join(root, REPORT_FILE)
    with open(html_path + ".tmp", "w", encoding="utf-8", newline="\n") as handle:
        handle.write(page)
    os.replace(html_path + ".tmp", html_path)
    return SweepResult(root, tuple(done), os.path.join(root, SWEEP_FILE), html_path, tuple(paths))


def describe_points(points: Sequence[SweepPoint], root: str) -> list[tuple[SweepPoint, str]]:
    """``(point, state)`` for each point, for a dry run."""
    return [(point, point_state(os.path.join(root, point.name))) for point in points]

