"""Checks of a finished analysis report, shared by the analysis tests and the end-to-end test:

    check_report(out)                     -> report.json, after checking every output file
    open_in_chromium(out / "report.html", tmp_path)
                                          -> the images as the browser loaded them, and a
                                             screenshot checked not to be blank

Chromium is Debian's `chromium` package, run headless; as root it needs --no-sandbox, and a
profile and HOME of its own keep it out of the user's.
"""

from __future__ import annotations

import csv
import html
import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from analysis import predicted
from analysis.sweep import SHAPE_WORDS
from analysis.tables import CI_METRICS, COLUMNS, WARNING_KINDS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Marks each image's load state on <body> once the page has loaded; --dump-dom prints it.
IMAGE_PROBE = (
    "<script>window.addEventListener('load', function () {"
    " var images = Array.prototype.slice.call(document.images);"
    " document.body.setAttribute('data-images', JSON.stringify(images.map(function (i) {"
    " return [i.complete, i.naturalWidth, i.naturalHeight]; })));"
    "});</script>"
)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE, "not a PNG"
    return struct.unpack(">II", data[16:24])


def check_report(out: Path) -> dict:
    """Every file the report promises exists and is what it claims; returns report.json."""
    document = json.loads((out / "report.json").read_text())
    assert document["kind"] == "analysis.report"
    with open(out / "summary.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and set(COLUMNS) <= set(rows[0]), rows[:1]
    assert len(rows) == len(document["rows"])
    for row in document["rows"]:
        budget = row["ddtree_budget"]
        if budget is None:
            # Only DDTree rows are compared with the chain control, or marked by the sweep.
            assert row["chain_control"] is None and row["speedup_vs_chain"] is None, row
            assert row["budget_diagnosis"] is None, row
        else:
            assert row["verify_tokens_per_step"] == budget + 1, row
            assert row["budget_diagnosis"] in (None, "collapsed", "saturated"), row
            if row["chain_control"] is None:
                assert row["speedup_vs_chain"] is None, row
        if row["accuracy_n"] is None:
            # An unscored prompt set: all three empty.
            assert row["accuracy"] is None and row["accuracy_unanswered"] is None, row
        else:
            assert 0 <= row["accuracy_unanswered"] <= row["accuracy_n"], row
            assert row["accuracy"] is None or 0 <= row["accuracy"] <= 1, row
        # Issue 19: SLO columns are filled exactly when SLOs were given, a row's repeats
        # bracket their mean, a flag is a flag.
        given = document.get("slo") is not None
        assert (row["slo_met"] is not None) == given, row
        assert (row["goodput_requests_per_s"] is not None) == given, row
        assert isinstance(row["under_filled"], bool), row
        assert row["repeats"] >= 1 and len(row["files"]) == row["repeats"], row
        for name in CI_METRICS:
            low, high = row[f"{name}_ci95_low"], row[f"{name}_ci95_high"]
            assert (low is None) == (high is None), row
            if low is not None:
                assert row["repeats"] >= 2 and low <= row[name] <= high, (name, row)
        if row["goodput_requests_per_s"] is not None and row["requests_per_s"] is not None:
            # requests_per_s is rounded to 4 decimals by the writer.
            assert row["goodput_requests_per_s"] <= row["requests_per_s"] + 1e-4, row
    scored = [r for r in document["rows"] if r["accuracy_n"] is not None]
    assert len(document["accuracy"]) == len(scored)
    failed = [c for c in document["api_checks"] if c["result"] == "failed"]
    assert len(failed) == sum(w["kind"] == "api_check_failed" for w in document["warnings"])
    assert all(w["kind"] in WARNING_KINDS for w in document["warnings"]), document["warnings"]
    assert (out / "summary.md").read_text().count("\n|") >= len(rows)
    assert (out / "recommendation.csv").is_file()
    check_predicted(out, document)
    page = (out / "report.html").read_text()
    sources = re.findall(r'<img[^>]* src="([^"]*)"', page)
    assert len(sources) == len(document["plots"]) > 0
    for name, source in zip(document["plots"], sources, strict=True):
        data = (out / name).read_bytes()
        width, height = png_size(data)
        assert width > 200 and height > 150, (name, width, height)
        assert source.startswith("data:image/png;base64,"), source[:40]
    # Self-contained: nothing fetched from anywhere.
    assert not re.search(r'(?:src|href)="(?!data:|#)', page)
    assert "<script" not in page
    return document


def check_predicted(out: Path, document: dict) -> None:
    """predicted.csv and ddtree_diagnosis.csv against report.json: every ratio is measured
    over predicted, every slow level has its warning, every verdict is one of the four."""
    with open(out / "predicted.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert rows == [] or list(rows[0]) == list(predicted.COLUMNS), rows[:1]
    found = document["predicted"]["rows"]
    assert len(rows) == len(found)
    for row in found:
        for metric, measured, model in (
            ("step_ms", "step_ms", "step_ms_predicted"),
            ("accepted_tokens_per_step", "accepted_tokens_per_step", None),
            ("tokens_per_s_per_request", "tokens_per_s_per_request", None),
            ("tokens_per_s", "output_tokens_per_s", "tokens_per_s_predicted"),
        ):
            model = model or f"{metric}_predicted"
            quotient = row[f"{metric}_ratio"]
            if row[measured] is None or not row[model]:
                assert quotient is None, (metric, row)
            else:
                assert quotient == pytest.approx(row[measured] / row[model], rel=1e-3), row
        assert row["step_ms_predicted"] > 0 and row["context_tokens"] >= 1, row
    slow = {w["where"] for w in document["warnings"] if w["kind"] == "slower_than_predicted"}
    marked = {
        f"{r['host']} / {r['config']} / {r['prompt_set']} / c{r['concurrency']}"
        for r in found
        if r["slower_than_predicted"]
    }
    assert slow == marked, (slow, marked)
    assert all(isinstance(n["note"], str) and n["where"] for n in document["predicted"]["notes"])
    with open(out / "ddtree_diagnosis.csv", newline="", encoding="utf-8") as handle:
        shapes = list(csv.DictReader(handle))
    assert len(shapes) == len(document["ddtree_diagnosis"])
    for shape, entry in zip(shapes, document["ddtree_diagnosis"], strict=True):
        assert entry["verdict"] in SHAPE_WORDS and shape["verdict"] == SHAPE_WORDS[entry["verdict"]]
        assert entry["best_budget"] in entry["budgets"], entry


def chromium() -> str | None:
    return shutil.which("chromium")


def open_in_chromium(page: Path, tmp_path: Path, width: int = 1400, height: int = 2600) -> dict:
    """{images: [[complete, naturalWidth, naturalHeight]], screenshot: path, ink: share of
    non-white pixels, colors: distinct colours} of the page as headless Chromium renders it."""
    binary = chromium()
    if binary is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    home = tmp_path / "chromium-home"
    home.mkdir(exist_ok=True)
    base = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={home / 'profile'}",
        f"--window-size={width},{height}",
    ]
    environment = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", IMAGE_PROBE + "</body>"))
    dom = subprocess.run(
        [*base, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        check=False,
    )
    found = re.search(r'data-images="([^"]*)"', dom.stdout)
    assert found, f"no image probe in the DOM; chromium said: {dom.stderr[-2000:]}"
    images = json.loads(html.unescape(found.group(1)))
    shot = tmp_path / "screenshot.png"
    done = subprocess.run(
        [*base, f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        check=False,
    )
    assert shot.is_file(), done.stderr[-2000:]
    assert png_size(shot.read_bytes()) == (width, height)
    from matplotlib.image import imread

    pixels = imread(str(shot))[:, :, :3]
    ink = float((pixels.sum(axis=2) < 2.9).mean())
    quantised = (pixels * 15).round().reshape(-1, 3)
    colors = len({tuple(p) for p in quantised[:: max(1, len(quantised) // 200_000)].tolist()})
    return {"images": images, "screenshot": shot, "ink": ink, "colors": colors}
