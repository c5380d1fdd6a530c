"""Draw the figures of an evaluation run and write report.html, one file with the figures embedded.

    alodlm-jax-report --output DIR [--report-dir DIR2] [--title TEXT]

DIR is an evaluate output directory (summary.json, predictions.jsonl). The report goes into DIR
(or --report-dir): report.html, which embeds its figures, and the same figures as report_*.png
files — per-benchmark scores and tokens per
second, the exit-depth histogram, the first-pass halting-probability histogram by benchmark,
recurrent passes per window and tokens committed per window. Figures whose data the predictions
lack (rescored predictions often carry only text, token counts and timing) are skipped and the page
says why. Bad input: one line on stderr, exit status 2.
"""

from __future__ import annotations

import sys
from typing import Sequence

from absl import flags

from alodlm_jax.cli.flags import run_command

PROG = "alodlm-jax-report"
FLAGS = flags.FlagValues()

flags.DEFINE_string("output", None, "Evaluation output directory to report on (required): holds "
                    "summary.json and predictions.jsonl.", flag_values=FLAGS)
flags.DEFINE_string("report_dir", None, "Where to write report.html and the figures. Default: "
                    "--output itself.", flag_values=FLAGS)
flags.DEFINE_string("title", None, "Page title. Default: 'Evaluation report: <directory name>'.",
                    flag_values=FLAGS)


def _report() -> int:
    from alodlm_jax.report.build import build_run_report

    result = build_run_report(FLAGS.output, FLAGS.report_dir, title=FLAGS.title)
    for key, reason in result.skipped:
        print(f"{PROG}: skipped figure {key}: {reason}", file=sys.stderr)
    print(result.html_path, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (``sys.argv`` by default); returns the exit status."""
    return run_command(_report, prog=PROG, description=__doc__, flag_values=FLAGS, argv=argv,
                       required=("output",))


def run() -> None:
    """Console entry point ``alodlm-jax-report``."""
    sys.exit(main())


if __name__ == "__main__":
    run()
