"""Self-contained HTML pages for one run and for a sweep.

A page is one file: its figures are embedded as base64 PNG data (each ``<img>`` also names its
PNG file, written next to the page, in ``data-file``), so ``report.html`` alone can be mailed,
copied or opened anywhere; there is no script, no external stylesheet and no network access.
Every string that comes from the data is escaped.
"""

from __future__ import annotations

import base64
import html
import json
import os
from typing import Any, Mapping, Sequence

__all__ = ["run_page", "sweep_page", "format_number"]

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1100px; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.8em;
       border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
.sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; font-size: 0.92em; }
th, td { padding: 0.3em 0.8em; border-bottom: 1px solid #e4e4e4; text-align: right; }
th { background: #f4f4f4; } td.name, th.name { text-align: left; }
tr.total td { font-weight: bold; border-top: 2px solid #bbb; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; margin-top: 0.3em; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 0.5em 0.8em; }
.warn { background: #fdecea; border-left: 4px solid #d9534f; padding: 0.5em 0.8em; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def format_number(value: Any, digits: int = 2) -> str:
    """Numbers for tables: fixed decimals for floats, plain integers, an en dash for missing."""
    if value is None:
        return "&ndash;"
    if isinstance(value, bool):
        return _e(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return _e(value)


def _page(title: str, body: Sequence[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{_e(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")


def _figure(filename: str, title: str, caption: str, image_dir: str) -> str:
    """A figure whose PNG (``image_dir``/``filename``) is embedded in the page as data."""
    with open(os.path.join(image_dir, filename), "rb") as handle:
        data = base64.b64encode(handle.read()).decode("ascii")
    return (f"<figure id=\"{_e(filename)}\"><h3>{_e(title)}</h3>"
            f"<img src=\"data:image/png;base64,{data}\" data-file=\"{_e(filename)}\" "
            f"alt=\"{_e(title)}\"><figcaption>{_e(caption)}</figcaption></figure>")


def _skipped(skipped: Sequence[tuple[str, str]]) -> list[str]:
    if not skipped:
        return []
    items = "".join(f"<li><b>{_e(title)}</b>: {_e(reason)}</li>" for title, reason in skipped)
    return [f"<div class=\"note\"><p>Figures not drawn because their data is absent:</p>"
            f"<ul>{items}</ul></div>"]


def _summary_table(summary: Mapping[str, Any]) -> str:
    head = ("<tr><th class=\"name\">benchmark</th><th>examples</th><th>correct</th>"
            "<th>score (%)</th><th>wall (s)</th><th>tokens</th><th>tokens/s</th></tr>")
    rows = []
    for name, values in summary["benchmarks"].items():
        rows.append(
            f"<tr><td class=\"name\">{_e(name)}</td><td>{format_number(values['examples'])}</td>"
            f"<td>{format_number(values['correct'])}</td>"
            f"<td>{format_number(float(values['score_percent']))}</td>"
            f"<td>{format_number(float(values['wall_seconds']), 3)}</td>"
            f"<td>{format_number(values['generated_tokens'])}</td>"
            f"<td>{format_number(float(values['tokens_per_second']), 1)}</td></tr>")
    examples = sum(int(v["examples"]) for v in summary["benchmarks"].values())
    tokens = sum(v["generated_tokens"] for v in summary["benchmarks"].values())
    rows.append(
        f"<tr class=\"total\"><td class=\"name\">macro over {format_number(summary['benchmark_count'])}"
        f" benchmark(s)</td><td>{examples}</td><td></td>"
        f"<td>{format_number(float(summary['macro_score_percent']))}</td>"
        f"<td>{format_number(float(summary['suite_wall_seconds']), 3)}</td>"
        f"<td>{format_number(tokens)}</td>"
        f"<td>{format_number(float(summary['suite_tokens_per_second']), 1)}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _protocol(summary: Mapping[str, Any]) -> list[str]:
    protocol = summary.get("protocol")
    if protocol is None:
        return ["<h2>Protocol</h2>", "<p class=\"note\">summary.json has no protocol block.</p>"]
    parts = ["<h2>Protocol</h2>"]
    decoder = protocol.get("decoder")
    if decoder == "supplied-predictions":
        parts.append("<p class=\"note\">Rescored predictions: timing and token counts were copied "
                     "from the supplied rows; the generation protocol is not verified.</p>")
    failures = protocol.get("scoring_failures") or []
    if failures:
        parts.append(f"<p class=\"warn\">{len(failures)} task(s) were scored incorrect because "
                     "scoring failed (see <code>scoring_failures</code> below).</p>")
    parts.append(f"<pre>{_e(json.dumps(protocol, indent=2))}</pre>")
    return parts


def run_page(*, title: str, summary: Mapping[str, Any], rows: int,
             figures: Sequence[tuple[str, str, str]], skipped: Sequence[tuple[str, str]],
             image_dir: str, notes: Sequence[str] = ()) -> str:
    """The report of one evaluation run.

    ``figures`` are ``(filename, title, caption)`` of drawn PNGs in ``image_dir`` (embedded);
    ``skipped`` are ``(title, reason)``; ``notes`` are extra plain-text remarks shown at the top.
    """
    protocol = summary.get("protocol") or {}
    decoder = protocol.get("decoder", "unknown decoder")
    decode = protocol.get("decode")
    setting = ""
    if isinstance(decode, dict):
        setting = "; " + ", ".join(f"{k}={v}" for k, v in decode.items())
    body = [f"<h1>{_e(title)}</h1>",
            f"<p class=\"sub\">{_e(decoder)}{_e(setting)}; {rows} prediction row(s)</p>"]
    body += [f"<p class=\"note\">{_e(note)}</p>" for note in notes]
    body += ["<h2>Summary</h2>", _summary_table(summary), "<h2>Figures</h2>"]
    body += _skipped(skipped)
    body += [_figure(*figure, image_dir) for figure in figures]
    body += _protocol(summary)
    return _page(title, body)


def sweep_page(*, title: str, subtitle: str, points: Sequence[Mapping[str, Any]],
               figures: Sequence[tuple[str, str, str]], skipped: Sequence[tuple[str, str]],
               image_dir: str) -> str:
    """The sweep's index page: frontier figures (PNGs in ``image_dir``, embedded) and one row per
    grid point, linked to the point's own report.

    Each point mapping has ``name``, ``q``, ``tau``, ``mode``, ``status``, ``report`` (relative
    link or ``None``) and the metrics ``macro_score_percent``, ``suite_tokens_per_second``,
    ``loop_token_passes_per_output_token``, ``mean_exit_depth``.
    """
    head = ("<tr><th class=\"name\">point</th><th>q</th><th>tau</th><th class=\"name\">mode</th>"
            "<th>macro score (%)</th><th>tokens/s</th><th>loop passes / token</th>"
            "<th>mean exit depth</th><th class=\"name\">status</th></tr>")
    rows = []
    for point in points:
        name = _e(point["name"])
        link = (f"<a href=\"{_e(point['report'])}\">{name}</a>" if point.get("report") else name)
        rows.append(
            f"<tr><td class=\"name\">{link}</td><td>{_e(point['q'])}</td><td>{_e(point['tau'])}</td>"
            f"<td class=\"name\">{_e(point['mode'])}</td>"
            f"<td>{format_number(point.get('macro_score_percent'))}</td>"
            f"<td>{format_number(point.get('suite_tokens_per_second'), 1)}</td>"
            f"<td>{format_number(point.get('loop_token_passes_per_output_token'), 3)}</td>"
            f"<td>{format_number(point.get('mean_exit_depth'), 3)}</td>"
            f"<td class=\"name\">{_e(point['status'])}</td></tr>")
    body = [f"<h1>{_e(title)}</h1>", f"<p class=\"sub\">{_e(subtitle)}</p>",
            "<h2>Grid points</h2>", f"<table>{head}{''.join(rows)}</table>",
            "<h2>Quality-speed frontiers</h2>"]
    body += _skipped(skipped)
    body += [_figure(*figure, image_dir) for figure in figures]
    return _page(title, body)
