"""No module of the package grows past 1,200 lines: a longer one is split where it divides."""

from __future__ import annotations

from pathlib import Path

LIMIT = 1200
PACKAGE = Path(__file__).resolve().parents[2] / "bmoe"


def test_no_module_is_longer_than_the_limit() -> None:
    lengths = {
        str(path.relative_to(PACKAGE.parent)): len(path.read_text(encoding="utf-8").splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert len(lengths) > 100  # the package was found
    assert {name: n for name, n in lengths.items() if n > LIMIT} == {}
