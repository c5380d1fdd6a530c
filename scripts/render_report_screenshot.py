#!/usr/bin/env python3
"""Render a report.html to a PNG with headless Chromium, for a quick visual check.

    python scripts/render_report_screenshot.py REPORT.html [OUT.png] [--width 1200] [--height 2400]

Looks for ``chromium``, ``chromium-browser``, ``google-chrome`` or ``google-chrome-stable`` on
PATH (or the CHROMIUM environment variable). Without one it says how to install it (Debian/Ubuntu:
``apt-get install -y chromium``) and exits with status 2. The page is opened from the local file
system; the report has no scripts or network resources, so the screenshot shows exactly what a
browser shows.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = ("no headless Chromium found (tried $CHROMIUM, " + ", ".join(CANDIDATES) + "). "
                "Install one, e.g. on Debian/Ubuntu: sudo apt-get install -y chromium "
                "(Ubuntu's snap-based chromium-browser also works), then rerun.")


def find_browser() -> str | None:
    explicit = os.environ.get("CHROMIUM")
    if explicit:
        return shutil.which(explicit) or (explicit if os.path.exists(explicit) else None)
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def screenshot(browser: str, page: pathlib.Path, out: pathlib.Path, width: int, height: int,
               timeout: float = 120.0) -> None:
    """One headless Chromium run; raises RuntimeError with Chromium's stderr tail on failure."""
    with tempfile.TemporaryDirectory(prefix="report-shot-") as profile:
        command = [browser, "--headless", "--no-sandbox", "--disable-gpu",
                   "--hide-scrollbars", "--no-first-run", "--disable-dev-shm-usage",
                   f"--user-data-dir={profile}", f"--window-size={width},{height}",
                   f"--screenshot={out}", page.resolve().as_uri()]
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if completed.returncode != 0 or not out.exists():
        tail = (completed.stderr or completed.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{browser} exited with {completed.returncode}: " + " | ".join(tail))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=pathlib.Path, help="report.html to render")
    parser.add_argument("out", type=pathlib.Path, nargs="?",
                        help="PNG to write (default: screenshot_report.png next to the report)")
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument("--height", type=int, default=2400)
    args = parser.parse_args(argv)
    if not args.report.is_file():
        print(f"render_report_screenshot: error: {args.report}: no such file", file=sys.stderr)
        return 2
    browser = find_browser()
    if browser is None:
        print(f"render_report_screenshot: error: {INSTALL_HINT}", file=sys.stderr)
        return 2
    out = args.out or args.report.with_name("screenshot_" + args.report.stem + ".png")
    out = out.resolve()
    if out.exists():
        out.unlink()
    try:
        screenshot(browser, args.report, out, args.width, args.height)
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as error:
        print(f"render_report_screenshot: error: {error}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
