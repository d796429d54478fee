"""The statistics module: Student's t against a printed table, the binomial test against
scipy's own (one p at a time), and scipy loaded on the first call, not on import."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bmoe.analyze import stats

ROOT = Path(__file__).resolve().parents[2]


def test_t_quantiles_are_a_printed_tables_and_nan_below_one_degree() -> None:
    got = stats.t_quantile(0.975, [1, 2, 10, 30, np.inf])
    assert got == pytest.approx([12.706, 4.303, 2.228, 2.042, 1.960], abs=5e-4)
    assert stats.t_quantile(0.9, 4.5)[0] < stats.t_quantile(0.9, 4)[0]  # fractional df
    assert np.isnan(stats.t_quantile(0.975, [0.5, np.nan, -1])).all()
    assert stats.normal_quantile(0.975) == pytest.approx(1.959964, abs=1e-6)


@pytest.mark.parametrize(("k", "n"), [(0, 5), (3, 4), (12, 12), (15, 40), (28, 30), (20, 20)])
def test_the_binomial_p_values_are_scipys_test_for_every_p(k: int, n: int) -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    grid = np.linspace(0.0, 1.0, 41)
    got = stats.binomial_two_sided_p(k, n, grid)
    expected = [scipy_stats.binomtest(k, n, p).pvalue for p in grid]
    assert got == pytest.approx(expected, abs=1e-12)
    assert got[0] == (1.0 if k == 0 else 0.0) and got[-1] == (1.0 if k == n else 0.0)
    assert all(math.isfinite(v) for v in got)


def test_importing_the_statistics_does_not_load_scipy() -> None:
    """Only a call does: the modules that compute verdicts and intervals import it freely."""
    code = (
        "import sys\n"
        "import bmoe.analyze.stats, bmoe.analyze.verdict, bmoe.analyze.device.tune\n"
        "import bmoe.analyze.device.interval\n"
        "before = 'scipy.stats' in sys.modules\n"
        "bmoe.analyze.stats.t_quantile(0.975, 3)\n"
        "print(before, 'scipy.stats' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.split() == ["False", "True"]
