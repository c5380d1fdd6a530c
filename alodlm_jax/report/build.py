"""One evaluation directory in, ``report.html`` (figures embedded) plus the PNG figures out."""

from __future__ import annotations

import dataclasses
import os

from . import figures as figure_specs
from .html import run_page
from .loading import read_summary
from .stats import RunStats, collect_run_stats

__all__ = ["REPORT_FILE", "RunReport", "build_run_report"]

REPORT_FILE = "report.html"


@dataclasses.dataclass(frozen=True)
class RunReport:
    """What :func:`build_run_report` wrote: the page, the drawn figures, the skipped ones."""

    html_path: str
    figure_paths: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]  # (figure key, reason)
    stats: RunStats


def build_run_report(directory: str | os.PathLike, report_dir: str | os.PathLike | None = None,
                     *, title: str | None = None) -> RunReport:
    """Read ``directory`` (an evaluation output) and write the report into ``report_dir``.

    ``report_dir`` defaults to ``directory`` itself. Figures whose data is absent are not drawn;
    an earlier report's file of that name is removed, so the page references every report figure
    in the folder.
    """
    directory = os.fspath(directory)
    report_dir = directory if report_dir is None else os.fspath(report_dir)
    summary = read_summary(directory)
    stats = collect_run_stats(directory)
    os.makedirs(report_dir, exist_ok=True)
    drawn, skipped, paths = [], [], []
    for spec in figure_specs.RUN_FIGURES:
        reason = spec.missing(summary, stats)
        if reason is not None:
            figure_specs.remove_stale(report_dir, spec)
            skipped.append((spec, reason))
            continue
        path = os.path.join(report_dir, spec.filename)
        spec.draw(summary, stats, path)
        drawn.append((spec.filename, spec.title, spec.caption))
        paths.append(path)
    notes = []
    if stats.rows == 0:
        notes.append("predictions.jsonl is missing or empty: only the summary figures are drawn.")
    page = run_page(
        title=title or f"Evaluation report: {os.path.basename(os.path.abspath(directory))}",
        summary=summary, rows=stats.rows, figures=drawn,
        skipped=[(spec.title, reason) for spec, reason in skipped], image_dir=report_dir,
        notes=notes)
    html_path = os.path.join(report_dir, REPORT_FILE)
    _write_text(html_path, page)
    return RunReport(html_path, tuple(paths), tuple((s.key, r) for s, r in skipped), stats)


def _write_text(path: str, text: str) -> None:
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(text)
    os.replace(temporary, path)
