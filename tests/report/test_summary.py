"""Geomean and bootstrap arithmetic of report summaries."""

import math

import pytest

from qlabench.report.summary import bootstrap_ci, geomean, summarise


def test_geomean_hand_computed():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([2.0, 0.5]) == pytest.approx(1.0)  # a 2x win and a 2x loss cancel
    assert geomean([3.0]) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="-1"):
        geomean([1.0, -1.0])
    with pytest.raises(ValueError):
        geomean([])


def test_bootstrap_ci_contains_geomean_and_is_deterministic():
    vals = [1.2, 1.9, 2.5, 2.8, 3.1, 3.3, 1.5, 2.2]
    lo, hi = bootstrap_ci(vals)
    g = geomean(vals)
    assert lo < g < hi
    assert min(vals) <= lo and hi <= max(vals)
    assert bootstrap_ci(vals) == (lo, hi)
    assert bootstrap_ci([2.0]) is None
    same = bootstrap_ci([2.0, 2.0, 2.0])
    assert same == pytest.approx((2.0, 2.0))


def test_summarise_skips_uncompared_and_names_worst_best():
    s = summarise("hk16_hv16", "fla", [("a", 2.0), ("b", None), ("c", 8.0), ("d", 4.0)])
    assert s.n == 3 and s.n_skipped == 1
    assert s.geomean == pytest.approx(math.exp((math.log(2) + math.log(8) + math.log(4)) / 3))
    assert (s.worst, s.worst_case, s.best, s.best_case) == (2.0, "a", 8.0, "c")
    assert s.ci_low <= s.geomean <= s.ci_high
    empty = summarise("x", "fla", [("a", None)])
    assert empty.n == 0 and empty.geomean is None
