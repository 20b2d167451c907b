"""Shared report cells (qlabench/report/layout.py)."""

from __future__ import annotations

from qlabench.report.layout import ran_pattern


def test_ran_pattern_names_the_lengths_run():
    assert ran_pattern("1x32768", [32768]) == "1x32768"  # ran as named: the name
    assert ran_pattern("8192x4", [8192] * 4) == "8192x4"
    assert ran_pattern("1x32768", [512]) == "1x512 (of 1x32768)"  # run --quick on the CPU
    assert ran_pattern("28672+4096", [448, 64]) == "448+64 (of 28672+4096)"
    assert ran_pattern("8192x4", [128] * 4) == "128x4 (of 8192x4)"
    assert ran_pattern("4096+pad1000", [400], 97) == "1x400+pad97 (of 4096+pad1000)"
    assert ran_pattern("4096+pad1000", [4096], 1000) == "4096+pad1000"
    assert ran_pattern("1x32768", None) == "1x32768" and ran_pattern("1x32768", [512], float("nan")) == "1x512 (of 1x32768)"
    assert ran_pattern("not a pattern", [3]) == "not a pattern"
