"""The README is the front door: at most 300 lines, one short line per
headline figure, and every figure in it is one docs/measurements.md
reports, under the section its link names."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
MEASUREMENTS = (ROOT / "docs" / "measurements.md").read_text()
# A figure: a ratio or a range of them (1.05×, 1.18–1.32×), a share (20/20),
# a time (97 ms), a percentage (+1.2%).
FIGURE = re.compile(r"\d[\d,.]*(?:–\d[\d,.]*)?×|\d+/\d+|\d[\d.]* ms|[+−-]\d[\d.]*%")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _headline_rows() -> list[tuple[str, str]]:
    section = README.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        m = re.match(r"\| \[[^\]]+\]\(docs/measurements\.md#([^)]+)\) \| (.+) \|$", line)
        if m:
            rows.append((m.group(1), m.group(2)))
    return rows


def test_the_readme_is_short():
    assert len(README.splitlines()) <= 300


def test_each_headline_figure_is_one_short_line():
    rows = _headline_rows()
    assert len(rows) >= 10
    for _, result in rows:
        assert len(result) <= 100, result


def test_each_headline_figure_is_in_measurements_under_its_section():
    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", MEASUREMENTS, re.M)}
    for anchor, result in _headline_rows():
        assert anchor in anchors, anchor
        for figure in FIGURE.findall(result):
            ends = figure.split("–")
            if len(ends) == 2:          # a range: each end, with its unit
                ends[0] += "×"
            for end in ends:
                assert end in MEASUREMENTS, (figure, result)
