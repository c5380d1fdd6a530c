"""The PNG figures of one evaluation run (matplotlib, Agg backend: no display needed).

Each figure is a :class:`FigureSpec`: a file name, a title and caption for the HTML, a function that
says why the figure cannot be drawn (``None`` when it can) and a function that draws it. Drawing
functions take the summary and the :class:`~alodlm_jax.report.stats.RunStats` and write one PNG;
they never decide availability themselves, so the report can list skipped figures with reasons.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless, deterministic raster output

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .stats import HALT_BINS, RunStats  # noqa: E402

__all__ = ["FigureSpec", "RUN_FIGURES", "benchmark_colors", "label_points", "save_figure"]

Summary = Mapping[str, Any]
DPI = 110


@dataclasses.dataclass(frozen=True)
class FigureSpec:
    key: str
    filename: str
    title: str
    caption: str
    missing: Callable[[Summary, RunStats], str | None]
    draw: Callable[[Summary, RunStats, str], None]


def benchmark_colors(names: Sequence[str]) -> dict[str, Any]:
    """A stable colour per benchmark name (sorted order, tab20 then tab20b)."""
    palette = list(plt.get_cmap("tab20").colors) + list(plt.get_cmap("tab20b").colors)
    return {name: palette[i % len(palette)] for i, name in enumerate(sorted(names))}


def save_figure(figure, path: str) -> None:
    """Write ``figure`` as PNG (no timestamp metadata, so reruns give identical bytes) and close it."""
    figure.savefig(path, format="png", dpi=DPI, bbox_inches="tight",
                   metadata={"Software": None})
    plt.close(figure)


# Where a point's label may go, in points from the marker (tried in order): right-above,
# right-below, left-above, left-below, then further out.
_LABEL_OFFSETS = ((5, 4), (5, -11), (-5, 4), (-5, -11), (5, 13), (5, -20), (-5, 13), (-5, -20),
                  (5, 22), (5, -29))


def label_points(axes, points: Sequence[tuple[float, float, str, Any]], fontsize: float = 7) -> None:
    """Label data points ``(x, y, text, color)`` so that no two labels overlap where room allows.

    Points that fall on the same spot (within 2 pixels) share one label (their texts joined, in
    black when their colours differ); each label takes the first offset around its point whose box
    overlaps no earlier label and stays inside the axes. Call after the axes' limits are final.
    """
    figure = axes.figure
    renderer = figure.canvas.get_renderer()
    to_pixels = axes.transData.transform
    groups: list[tuple[Any, list[str], list[Any]]] = []  # (pixel position, texts, colors)
    for x, y, text, color in points:
        where = to_pixels((x, y))
        for position, texts, colors in groups:
            if abs(position[0] - where[0]) <= 2 and abs(position[1] - where[1]) <= 2:
                if text not in texts:
                    texts.append(text)
                colors.append(color)
                break
        else:
            groups.append((where, [text], [color]))
    frame = axes.get_window_extent(renderer)
    placed = []
    for position, texts, colors in groups:
        x, y = axes.transData.inverted().transform(position)
        color = colors[0] if all(c == colors[0] for c in colors) else "black"
        label = None
        for dx, dy in _LABEL_OFFSETS:
            if label is not None:
                label.remove()
            label = axes.annotate(", ".join(texts), (x, y), textcoords="offset points",
                                  xytext=(dx, dy), fontsize=fontsize, color=color,
                                  ha="left" if dx > 0 else "right")
            box = label.get_window_extent(renderer)
            inside = (box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0
                      and box.y1 <= frame.y1)
            if inside and not any(box.overlaps(other) for other in placed):
                break
        else:  # no free place: the first one
            label.remove()
            dx, dy = _LABEL_OFFSETS[0]
            label = axes.annotate(", ".join(texts), (x, y), textcoords="offset points",
                                  xytext=(dx, dy), fontsize=fontsize, color=color)
        placed.append(label.get_window_extent(renderer))


def _bar_height(count: int) -> float:
    return max(2.4, 0.38 * count + 1.2)


def _horizontal_bars(summary: Summary, key: str, xlabel: str, suite_value: float,
                     suite_label: str, fmt: str, path: str, xmax: float | None = None,
                     track: float | None = None) -> None:
    """One bar per benchmark with its value beside it, and the suite's value as a dashed line
    labelled at its top. ``track``: the scale's end (100 for percentages), drawn as a light band
    behind every bar so that a zero reads as an empty band rather than as nothing."""
    names = list(summary["benchmarks"])
    values = [float(summary["benchmarks"][n][key]) for n in names]
    colors = benchmark_colors(names)
    figure, axes = plt.subplots(figsize=(7.5, _bar_height(len(names)) + 0.3))
    positions = np.arange(len(names))
    if track is not None:
        axes.barh(positions, [track] * len(names), color="#f0f0f0", zorder=0)
    axes.barh(positions, values, color=[colors[n] for n in names], zorder=2)
    zero = [y for y, value in zip(positions, values) if value == 0]
    if zero:  # a zero-length bar is invisible: mark where it starts
        axes.scatter([0] * len(zero), zero, marker="|", s=120, color="#555555", zorder=3,
                     clip_on=False)
    axes.set_yticks(positions, names)
    axes.invert_yaxis()
    top = max(values + [suite_value, 1e-9])
    limit = xmax if xmax is not None else top * 1.18
    axes.axvline(suite_value, color="black", linestyle="--", linewidth=1, zorder=4)
    axes.annotate(f"{suite_label} {format(suite_value, fmt)}", (suite_value, 1.0),
                  xycoords=("data", "axes fraction"), xytext=(0, 3), textcoords="offset points",
                  ha="left" if suite_value < 0.8 * limit else "right", va="bottom", fontsize=8)
    for y, value in zip(positions, values):
        axes.text(value + limit * 0.012, y, format(value, fmt), va="center", fontsize=8, zorder=5,
                  bbox={"facecolor": "white", "edgecolor": "none", "alpha": 1.0, "pad": 1})
    if not any(values):
        axes.set_title("every benchmark is at 0", fontsize=9, pad=16)
    axes.set_xlim(0, limit)
    axes.set_xlabel(xlabel)
    axes.grid(axis="x", alpha=0.3)
    axes.set_axisbelow(True)
    save_figure(figure, path)


def _draw_scores(summary: Summary, stats: RunStats, path: str) -> None:
    _horizontal_bars(summary, "score_percent", "score (%)", float(summary["macro_score_percent"]),
                     "macro", ".1f", path, xmax=112.0, track=100.0)


def _draw_tokens_per_second(summary: Summary, stats: RunStats, path: str) -> None:
    _horizontal_bars(summary, "tokens_per_second", "generated tokens per second",
                     float(summary["suite_tokens_per_second"]), "suite", ".1f", path)


def _missing_scores(summary: Summary, stats: RunStats) -> str | None:
    return None if summary["benchmarks"] else "summary.json lists no benchmarks"


def _missing_exit_depths(summary: Summary, stats: RunStats) -> str | None:
    if not stats.exit_depth_rows:
        return "no prediction row has exit_depths (rescored or foreign predictions)"
    if not any(stats.exit_depth_counts.values()):
        return "no tokens were generated"
    return None


def _draw_exit_depths(summary: Summary, stats: RunStats, path: str) -> None:
    counts = {b: c for b, c in stats.exit_depth_counts.items() if c}
    depths = sorted({d for c in counts.values() for d in c})
    colors = benchmark_colors(list(counts))
    figure, axes = plt.subplots(figsize=(7.5, 4.2))
    low, high = min(depths), max(depths)
    x = np.arange(low, high + 1)
    bottom = np.zeros(len(x))
    for benchmark, by_depth in counts.items():
        heights = np.array([by_depth.get(int(d), 0) for d in x], dtype=float)
        axes.bar(x, heights, bottom=bottom, color=colors[benchmark], label=benchmark, width=0.8)
        bottom += heights
    total = bottom.sum()
    mean = stats.mean_exit_depth
    axes.set_xticks(x)
    axes.set_xlabel("exit depth (pass at which the token committed)")
    axes.set_ylabel("tokens")
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_title(f"{int(total)} tokens, mean exit depth {mean:.3f}", fontsize=9)
    axes.legend(fontsize=7, ncol=2 if len(counts) > 6 else 1, loc="upper left",
                bbox_to_anchor=(1.01, 1.0))
    axes.grid(axis="y", alpha=0.3)
    axes.set_axisbelow(True)
    save_figure(figure, path)


def _missing_halts(summary: Summary, stats: RunStats) -> str | None:
    if not stats.halt_rows:
        return ("no prediction row has first_pass_halt_probabilities "
                "(rescored or foreign predictions)")
    if not any(h.sum() for h in stats.halt_histograms.values()):
        return "no tokens were generated"
    return None


def _draw_halts(summary: Summary, stats: RunStats, path: str) -> None:
    histograms = {b: h for b, h in stats.halt_histograms.items() if h.sum()}
    colors = benchmark_colors(list(histograms))
    count = len(histograms)
    columns = min(3, count)
    rows = math.ceil(count / columns)
    # Constrained layout sizes the margins to the labels (a fixed fraction of a tall figure left
    # a blank band under the panels).
    figure, grid = plt.subplots(rows, columns, figsize=(3.0 * columns + 1.0, 2.2 * rows + 0.6),
                                sharex=True, squeeze=False, layout="constrained")
    widths = np.diff(HALT_BINS)
    for index, (benchmark, counts) in enumerate(histograms.items()):
        axes = grid[index // columns][index % columns]
        fractions = counts / counts.sum()
        axes.bar(HALT_BINS[:-1], fractions, width=widths, align="edge",
                 color=colors[benchmark], edgecolor="white", linewidth=0.4)
        axes.set_title(f"{benchmark} ({int(counts.sum())} tokens)", fontsize=8)
        axes.set_xlim(0, 1)
        axes.tick_params(labelsize=7, labelbottom=True)  # hidden panels leave gaps below
        axes.grid(axis="y", alpha=0.3)
        axes.set_axisbelow(True)
    for index in range(count, rows * columns):
        grid[index // columns][index % columns].set_visible(False)
    figure.supxlabel("first-pass halting probability of the committing window", fontsize=9)
    figure.supylabel("fraction of tokens", fontsize=9)
    figure.get_layout_engine().set(h_pad=0.06, w_pad=0.06)
    save_figure(figure, path)


def _missing_windows(summary: Summary, stats: RunStats) -> str | None:
    if not stats.window_rows:
        return ("no prediction row has outer_steps > 0 with recurrent_passes "
                "(rescored or foreign predictions, or nothing generated)")
    return None


def _histogram(values: Sequence[float], xlabel: str, path: str, integer_bins: bool) -> None:
    data = np.asarray(values, dtype=np.float64)
    figure, axes = plt.subplots(figsize=(7.5, 3.8))
    low, high = float(data.min()), float(data.max())
    if integer_bins and high - low <= 40:  # quarter-unit bins centred on whole numbers
        bins = np.arange(math.floor(low) - 0.125, high + 0.25, 0.25)
    else:
        bins = 30 if high > low else np.array([low - 0.5, low + 0.5])
    axes.hist(data, bins=bins, color="#4c72b0", edgecolor="white", linewidth=0.4)
    mean = float(data.mean())
    axes.axvline(mean, color="black", linestyle="--", linewidth=1, label=f"mean {mean:.2f}")
    axes.set_xlabel(xlabel)
    axes.set_ylabel("tasks")
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_title(f"{len(data)} tasks; median {float(np.median(data)):.2f}", fontsize=9)
    axes.legend(fontsize=8)
    axes.grid(axis="y", alpha=0.3)
    axes.set_axisbelow(True)
    save_figure(figure, path)


def _draw_passes_per_window(summary: Summary, stats: RunStats, path: str) -> None:
    _histogram(stats.passes_per_window, "recurrent passes per window (recurrent_passes / "
               "outer_steps, per task)", path, integer_bins=True)


def _draw_tokens_per_window(summary: Summary, stats: RunStats, path: str) -> None:
    _histogram(stats.tokens_per_window, "tokens committed per window (generated_tokens / "
               "outer_steps, per task)", path, integer_bins=True)


def _missing_tokens_per_window(summary: Summary, stats: RunStats) -> str | None:
    return _missing_windows(summary, stats) or (
        None if stats.tokens_per_window else "no row with windows has generated_tokens")


RUN_FIGURES: tuple[FigureSpec, ...] = (
    FigureSpec("scores", "report_scores.png", "Score per benchmark",
               "Percent correct per benchmark; the dashed line is the unweighted macro average.",
               _missing_scores, _draw_scores),
    FigureSpec("tokens_per_second", "report_tokens_per_second.png", "Throughput per benchmark",
               "Generated tokens over wall seconds (prefill plus decoding) per benchmark; the "
               "dashed line is the suite's total tokens over total time.",
               _missing_scores, _draw_tokens_per_second),
    FigureSpec("exit_depths", "report_exit_depths.png", "Exit depths",
               "How many loop passes each committed token took in its committing window, "
               "stacked by benchmark.", _missing_exit_depths, _draw_exit_depths),
    FigureSpec("first_pass_halt", "report_first_pass_halt.png",
               "First-pass halting probability by benchmark",
               "The exit gate's hazard at pass 1 of each token's committing window (20 bins on "
               "[0, 1], fraction of the benchmark's tokens).", _missing_halts, _draw_halts),
    FigureSpec("passes_per_window", "report_passes_per_window.png", "Passes per window",
               "Mean number of recurrent passes per decoding window, one value per task.",
               _missing_windows, _draw_passes_per_window),
    FigureSpec("tokens_per_window", "report_tokens_per_window.png", "Tokens per window",
               "Mean number of tokens committed per decoding window, one value per task.",
               _missing_tokens_per_window, _draw_tokens_per_window),
)


def remove_stale(directory: str, spec: FigureSpec) -> None:
    """Delete a figure left by an earlier report whose data is gone (the HTML must not miss it)."""
    try:
        os.remove(os.path.join(directory, spec.filename))
    except FileNotFoundError:
        pass
