"""The tests mirror the package: each test module sits in the folder of the package it tests
(``tests/analyze/`` for ``bmoe/analyze``, ``tests/analyze/device/`` for
``bmoe/analyze/device``, ...) or in ``tests/project/`` for the checks of the
whole repository; the shared helpers stay at the top of ``tests/``."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PACKAGE = TESTS.parent / "bmoe"


def test_test_modules_sit_in_the_folder_of_their_package() -> None:
    folders = {p.parent for p in TESTS.rglob("test_*.py")} - {TESTS}
    assert len(folders) >= 7  # the tests were found
    for folder in folders:
        rel = folder.relative_to(TESTS)
        assert rel == Path("project") or (PACKAGE / rel / "__init__.py").is_file(), (
            f"tests/{rel}/ mirrors no package of bmoe (tests/x/y/ holds the tests of bmoe/x/y)"
        )
        # each folder is a package, so that test modules of one name in two folders do not clash
        assert (folder / "__init__.py").is_file(), f"tests/{rel}/ has no __init__.py"


def test_no_test_module_is_left_at_the_top() -> None:
    top = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not top, f"move into tests/<package>/: {top}"
