"""alodlm-jax-report on synthetic evaluation outputs: a generate-mode and a rescore-mode directory.

The fixtures are written with the scoring package's own row, aggregation and protocol functions,
so they are byte-for-byte what the evaluate command writes (SCORING.md §7).
"""

from __future__ import annotations

import base64
import json
import math
import os
import random
import re

import pytest

from alodlm_jax.cli import report as report_cli
from alodlm_jax.report import figures
from alodlm_jax.report.build import build_run_report
from alodlm_jax.report.stats import collect_rows
from alodlm_scoring import outputs

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BENCHMARKS = ("arc_challenge", "gsm8k", "humaneval", "mmlu")
DECODE = {"q": 0.5, "tau": 0.4, "window_size": 16, "max_new_tokens": 64,
          "position_penalty": None, "mode": "entropy"}


def generate_result(rng: random.Random, *, max_depth: int = 4, window: int = 16,
                    q: float = 0.5) -> dict:
    """A plausible decoder result (MODEL_AND_DECODING.md §6.6 keys, in order)."""
    tokens = rng.randint(0, 40)
    steps = max(1, math.ceil(tokens / rng.randint(2, 6))) if tokens else 1
    passes = sum(rng.randint(1, max_depth) for _ in range(steps))
    depths = [rng.randint(1, max_depth) for _ in range(tokens)]
    wall = round(0.01 + 0.002 * passes * (1.0 + q), 6)
    return {
        "text": " ".join(f"t{rng.randint(13, 60)}" for _ in range(tokens)),
        "token_ids": [rng.randint(13, 60) for _ in range(tokens)],
        "prompt_tokens": rng.randint(5, 30),
        "generated_tokens": tokens,
        "wall_seconds": wall,
        "prefill_seconds": wall / 10,
        "tokens_per_second": tokens / wall,
        "mean_exit_depth": sum(depths) / tokens if tokens else None,
        "loop_token_passes": passes * window,
        "loop_token_passes_per_output_token": passes * window / tokens if tokens else None,
        "outer_steps": steps,
        "recurrent_passes": passes,
        "exit_depths": depths,
        "first_pass_halt_probabilities": [rng.random() for _ in range(tokens)],
        "stop_reason": rng.choice(["eos", "length"]),
    }


def _write(directory, rows, protocol) -> dict:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "predictions.jsonl"), "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(outputs.row_line(row))
    summary = outputs.aggregate(rows)
    summary["protocol"] = protocol
    outputs.write_summary(os.path.join(directory, "summary.json"), summary)
    return summary


def write_generate_run(directory, *, seed: int = 0, per_benchmark: int = 3,
                       benchmarks=BENCHMARKS, decode=DECODE) -> dict:
    """A generate-mode evaluation directory; returns its summary."""
    rng = random.Random(seed)
    rows = []
    for benchmark in benchmarks:
        for index in range(per_benchmark):
            task = {"benchmark": benchmark, "id": f"{benchmark}-{index}"}
            result = generate_result(rng, q=decode["q"])
            extracted = None if benchmark == "humaneval" else "B"
            rows.append(outputs.prediction_row(result, task, rng.random() < 0.6, extracted))
    protocol = outputs.protocol_block(
        decoder="jax-xla-portable", input_sha256="0" * 64, decode=decode, precision="fp32",
        device="cpu", timing=outputs.GENERATE_TIMING, device_kind="cpu", compile_seconds=1.5)
    return _write(directory, rows, protocol)


def write_rescore_run(directory, *, seed: int = 1) -> dict:
    """A rescore-mode directory whose rows carry only the keys rescoring requires."""
    rng = random.Random(seed)
    rows = []
    for benchmark in BENCHMARKS:
        for index in range(2):
            supplied = {"benchmark": benchmark, "id": index, "text": "The answer is (B).",
                        "generated_tokens": rng.randint(1, 30),
                        "wall_seconds": rng.choice([0.5, 1, 0.25])}  # integer seconds allowed
            rows.append(outputs.prediction_row(supplied, supplied, rng.random() < 0.5, "B"))
    protocol = outputs.protocol_block(
        decoder=outputs.RESCORE_DECODER, input_sha256="1" * 64, decode=None, precision=None,
        device=None, timing=outputs.RESCORE_TIMING, predictions_sha256="2" * 64,
        scoring_failures=[{"benchmark": "humaneval", "id": 1, "reason": "code_scoring_timeout"}])
    return _write(directory, rows, protocol)


def embedded_images(html_text: str) -> dict[str, bytes]:
    """The page's images by the PNG file each names (``data-file``): every ``<img>`` must carry
    its PNG as base64 data, so the page needs no file beside it."""
    images = {}
    for tag in re.findall(r"<img [^>]*>", html_text):
        source = re.search(r'src="([^"]*)"', tag).group(1)
        assert source.startswith("data:image/png;base64,"), source[:80]
        data = base64.b64decode(source.removeprefix("data:image/png;base64,"), validate=True)
        assert data[:8] == PNG_SIGNATURE
        images[re.search(r'data-file="([^"]*)"', tag).group(1)] = data
    return images


def referenced_images(html_text: str) -> set[str]:
    return set(embedded_images(html_text))


def assert_png(path: str, min_bytes: int = 5_000) -> None:
    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:8] == PNG_SIGNATURE, path
    assert min_bytes < len(data) < 2_000_000, (path, len(data))


def test_generate_mode_report_draws_every_figure(tmp_path):
    write_generate_run(tmp_path)
    result = build_run_report(tmp_path)
    assert result.skipped == ()
    names = {os.path.basename(p) for p in result.figure_paths}
    assert names == {spec.filename for spec in figures.RUN_FIGURES}
    for path in result.figure_paths:
        assert_png(path)
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    on_disk = {p.name for p in tmp_path.glob("*.png")}
    assert referenced_images(page) == on_disk == names
    for benchmark in BENCHMARKS:  # the summary table
        assert f'<td class="name">{benchmark}</td>' in page
    assert "jax-xla-portable" in page and "&quot;compile_seconds&quot;: 1.5" in page


def test_rescore_mode_report_skips_decoder_figures_and_says_so(tmp_path):
    generated = tmp_path / "gen"
    rescored = tmp_path / "res"
    write_generate_run(generated)
    write_rescore_run(rescored)
    # An earlier report's decoder figures must not linger unreferenced next to the new page.
    for spec in figures.RUN_FIGURES:
        (rescored / spec.filename).write_bytes((generated / "summary.json").read_bytes())
    result = build_run_report(rescored)
    assert {key for key, _ in result.skipped} == {
        "exit_depths", "first_pass_halt", "passes_per_window", "tokens_per_window"}
    page = (rescored / "report.html").read_text(encoding="utf-8")
    assert referenced_images(page) == {p.name for p in rescored.glob("*.png")} == {
        "report_scores.png", "report_tokens_per_second.png"}
    for path in result.figure_paths:
        assert_png(path)
    assert "Figures not drawn because their data is absent" in page
    assert "exit_depths" in page and "Rescored predictions" in page
    assert "1 task(s) were scored incorrect" in page


def test_the_page_alone_holds_its_figures(tmp_path):
    """report.html is one file: each figure is embedded with the bytes of the PNG written beside
    it, and nothing on the page points at another file."""
    write_generate_run(tmp_path / "run")
    result = build_run_report(tmp_path / "run")
    page = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    images = embedded_images(page)
    assert set(images) == {spec.filename for spec in figures.RUN_FIGURES}
    for name, data in images.items():
        assert data == (tmp_path / "run" / name).read_bytes()
    assert not re.search(r'(?:src|href)="(?!data:)', page)
    alone = tmp_path / "mailed" / "report.html"  # copied without the folder
    alone.parent.mkdir()
    alone.write_text(page, encoding="utf-8")
    assert embedded_images(alone.read_text(encoding="utf-8")) == images
    assert len(result.figure_paths) == len(images)


def test_report_into_a_separate_directory(tmp_path):
    write_generate_run(tmp_path / "run", per_benchmark=1, benchmarks=("mmlu",))
    result = build_run_report(tmp_path / "run", tmp_path / "out", title="<Run & co>")
    assert result.html_path == str(tmp_path / "out" / "report.html")
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "&lt;Run &amp; co&gt;" in page and "<Run & co>" not in page
    assert not list((tmp_path / "run").glob("*.png"))


def test_stats_follow_the_rows():
    rows = [
        {"benchmark": "b", "generated_tokens": 6, "outer_steps": 3, "recurrent_passes": 6,
         "loop_token_passes": 48, "exit_depths": [1, 2, 2, 3, 1, 1],
         "first_pass_halt_probabilities": [0.0, 0.99, 1.0, 0.5, 0.51, 0.2]},
        {"benchmark": "a", "generated_tokens": 0, "outer_steps": 0, "recurrent_passes": 0,
         "loop_token_passes": 0, "exit_depths": [], "first_pass_halt_probabilities": []},
        {"benchmark": "a", "generated_tokens": 4, "wall_seconds": 1},  # rescored row
    ]
    stats = collect_rows(rows)
    assert stats.rows == 3 and stats.exit_depth_rows == 2 and stats.halt_rows == 2
    assert stats.exit_depth_counts == {"a": {}, "b": {1: 3, 2: 2, 3: 1}}
    assert stats.mean_exit_depth == pytest.approx(10 / 6)
    assert stats.halt_histograms["b"].tolist() == [1, 0, 0, 0, 1, 0, 0, 0, 0, 0,
                                                   2, 0, 0, 0, 0, 0, 0, 0, 0, 2]
    assert stats.passes_per_window == (2.0,) and stats.tokens_per_window == (2.0,)
    assert stats.loop_token_passes_per_output_token == 8.0


def test_cli_writes_report_and_accepts_dash_spellings(tmp_path, capsys):
    write_generate_run(tmp_path / "run", per_benchmark=1)
    status = report_cli.main(["alodlm-jax-report", "--output", str(tmp_path / "run"),
                              "--report-dir", str(tmp_path / "rep")])
    assert status == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "rep" / "report.html")


@pytest.mark.parametrize("make, expected", [
    (lambda d: None, "not a directory"),
    (lambda d: d.mkdir(), "no summary.json (is this an evaluation output directory?)"),
    (lambda d: (d.mkdir(), (d / "predictions.jsonl").write_text("")), "the run is unfinished"),
    (lambda d: (d.mkdir(), (d / "summary.json").write_text("{")), "summary.json:1: invalid JSON"),
    (lambda d: (d.mkdir(), (d / "summary.json").write_text('{"benchmarks": {"x": {}}}')),
     "field 'benchmarks.x.examples'"),
])
def test_cli_bad_input_is_one_line_and_status_2(tmp_path, capsys, make, expected):
    target = tmp_path / "eval"
    make(target)
    status = report_cli.main(["alodlm-jax-report", "--output", str(target)])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("alodlm-jax-report: error: ")
    assert expected in err


def test_cli_bad_prediction_row_names_line_and_field(tmp_path, capsys):
    write_generate_run(tmp_path, per_benchmark=1)
    lines = (tmp_path / "predictions.jsonl").read_text().splitlines(keepends=True)
    row = json.loads(lines[1])
    row["exit_depths"] = ["deep"]
    lines[1] = json.dumps(row) + "\n"
    (tmp_path / "predictions.jsonl").write_text("".join(lines))
    assert report_cli.main(["alodlm-jax-report", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "predictions.jsonl:2:" in err and "'exit_depths'" in err


def test_cli_requires_output(capsys):
    assert report_cli.main(["alodlm-jax-report"]) == 2
    assert "--output" in capsys.readouterr().err


def test_point_labels_do_not_overlap_where_there_is_room():
    """Sweep labels of nearby points are moved apart; points on one spot share one label."""
    from alodlm_jax.report.figures import label_points, plt

    figure, axes = plt.subplots(figsize=(7.5, 5.0))
    points = [(100.0, 10.0, "q=0.3", "C0"), (100.02, 10.05, "q=0.5", "C0"),
              (100.04, 10.0, "q=0.3", "C1"), (100.5, 0.0, "q=0.3", "C2"),
              (100.5, 0.0, "q=0.5", "C3")]
    axes.plot([p[0] for p in points], [p[1] for p in points], "o")
    axes.set_xlim(99.5, 101.0)
    axes.set_ylim(-1, 16)
    label_points(axes, points)
    renderer = figure.canvas.get_renderer()
    labels = [text for text in axes.texts]
    assert sorted(text.get_text() for text in labels) == ["q=0.3", "q=0.3", "q=0.3, q=0.5", "q=0.5"]
    boxes = [text.get_window_extent(renderer) for text in labels]
    for i, box in enumerate(boxes):
        assert not any(box.overlaps(other) for other in boxes[i + 1:])
    plt.close(figure)


def test_halting_figure_has_no_blank_band(tmp_path):
    """No band of empty canvas anywhere (the panels used to end a tenth of the figure above their
    axis label): the longest run of blank pixel rows is under 3 % of the height."""
    import matplotlib.image

    write_generate_run(tmp_path, benchmarks=BENCHMARKS + ("mbpp", "math500", "gpqa"))
    build_run_report(tmp_path)
    pixels = matplotlib.image.imread(tmp_path / "report_first_pass_halt.png")[..., :3]
    longest = run = 0
    for row in pixels:
        run = 0 if (row < 0.9).any() else run + 1
        longest = max(longest, run)
    assert longest < 0.03 * pixels.shape[0], (longest, pixels.shape[0])


def test_an_all_zero_suite_still_shows_a_row_per_benchmark(tmp_path):
    """Score bars sit on a 0-100 track, so a suite where every answer is wrong draws a visible
    (empty) track for each benchmark rather than an empty chart."""
    import matplotlib.image

    rng = random.Random(3)
    rows = [outputs.prediction_row(generate_result(rng), {"benchmark": name, "id": str(i)},
                                   False, None) for name in BENCHMARKS for i in range(2)]
    protocol = outputs.protocol_block(
        decoder="jax-xla-compiled", input_sha256="0" * 64, decode=DECODE, precision="fp32",
        device="cpu", timing=outputs.GENERATE_TIMING, device_kind="cpu", compile_seconds=1.0)
    summary = _write(tmp_path, rows, protocol)
    assert summary["macro_score_percent"] == 0
    build_run_report(tmp_path)
    pixels = matplotlib.image.imread(tmp_path / "report_scores.png")[..., :3]
    track = (abs(pixels - 240 / 255) < 0.01).all(axis=-1)
    rows_with_track = track.sum(axis=1) > 0.3 * pixels.shape[1]  # rows crossed by a track
    # one band of track pixels per benchmark, each several pixel rows tall
    bands = int(rows_with_track[0]) + int((rows_with_track[1:] & ~rows_with_track[:-1]).sum())
    assert bands == len(BENCHMARKS)
