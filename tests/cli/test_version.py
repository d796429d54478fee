"""``bmoe --version`` prints the package's version and exits 0."""

from __future__ import annotations

import bmoe
from bmoe.cli import main


def test_version(capsys) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"bmoe {bmoe.__version__}"
