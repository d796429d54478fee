"""Reports opened in a real browser (headless Chromium, see tests/headless.py): no console
errors, no request leaves the page, every plot decodes, and a sweep report's verdict is on
the first screen. Skips, saying so, where no Chromium is installed (``.ci/run`` installs
Debian's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from headless import find_chromium, visit

from bmoe.cli import main

pytestmark = pytest.mark.slow  # a browser and whole reports

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench-data"

#: Where the verdict lands, and whether every image decoded.
LOOK = """(() => {
  const verdict = document.querySelector("p.verdict");
  const box = verdict ? verdict.getBoundingClientRect() : null;
  return {
    verdict: verdict ? verdict.textContent : null,
    top: box && box.top, bottom: box && box.bottom, screen: window.innerHeight,
    images: [...document.images].map((i) => i.complete && i.naturalWidth > 0),
    title: document.title,
  };
})()"""


@pytest.fixture(scope="module")
def browser() -> str:
    found = find_chromium()
    if found is None:
        pytest.skip(
            "no Chromium to open the reports in (Debian: apt-get install chromium; .ci/run "
            "installs it; $BMOE_CHROMIUM names another): the browser checks did not run"
        )
    return found


def _report(tmp_path: Path, *args: str) -> Path:
    page = tmp_path / "report.html"
    assert main(["report", *args, "-o", str(page)]) == 0
    return page


def _offline(requests: list[str], page: Path) -> None:
    """The page asked for itself and its inline images only."""
    others = [u for u in requests if u != page.resolve().as_uri() and not u.startswith("data:")]
    assert not others, others


@pytest.mark.parametrize(("width", "height"), [(1280, 720), (1024, 600)])
def test_sweep_report_opens_clean_with_the_verdict_on_the_first_screen(
    browser: str, tmp_path: Path, width: int, height: int
) -> None:
    page = _report(tmp_path, str(BENCH / "2026-11-29-tiny-cache-lanes"))
    seen = visit(browser, page, LOOK, width, height)
    assert seen.errors == []
    _offline(seen.requests, page)
    got = seen.evaluated
    assert got["title"] == "Sweep report: tiny-cache-lanes"
    assert got["verdict"].startswith("Ranking by tok_s_mean")
    assert 0 <= got["top"] < got["bottom"] <= got["screen"] == height, got
    assert got["images"] and all(got["images"])  # every plot decoded
    assert seen.screenshot.startswith(b"\x89PNG")


def test_traced_sweep_report_with_a_run_in_full_opens_clean(browser: str, tmp_path: Path) -> None:
    root = BENCH / "2026-11-29-small-traces"
    page = _report(tmp_path, str(root), "--run", "cache_mb-64_io_threads-1-281579ec")
    seen = visit(browser, page, LOOK)
    assert seen.errors == []
    _offline(seen.requests, page)
    assert seen.evaluated["verdict"].startswith("Ranking by tok_s_mean not settled")
    assert seen.evaluated["bottom"] <= seen.evaluated["screen"]
    assert len(seen.evaluated["images"]) > 5 and all(seen.evaluated["images"])


def test_the_checks_see_what_a_broken_page_does(browser: str, tmp_path: Path) -> None:
    """The errors, requests and positions above come from the page: a page that logs an
    error, throws, asks for a missing file and puts its verdict below the fold is caught."""
    page = tmp_path / "broken.html"
    page.write_text(
        "<!DOCTYPE html><html><head><title>t</title></head><body>"
        '<div style="height: 2000px"></div><p class="verdict">late</p>'
        '<img src="missing.png"><script>console.error("said"); undefined_name();</script>'
        "</body></html>",
        encoding="utf-8",
    )
    seen = visit(browser, page, LOOK, 800, 600)
    assert any("said" in e for e in seen.errors)
    assert any("undefined_name" in e for e in seen.errors)
    assert any(u.endswith("/missing.png") for u in seen.requests)
    assert seen.evaluated["top"] > seen.evaluated["screen"]
    assert seen.evaluated["images"] == [False]
