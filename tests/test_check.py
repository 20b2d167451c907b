"""Correctness metrics against the reference (qlabench/check.py): non-finite counts per tensor."""

import math

import torch

from qlabench.check import compare, nonfinite_count


def test_nonfinite_counts_only_tensors_with_nan_or_inf():
    ref = torch.ones(2, 3)
    bad = ref.clone()
    bad[0, 0], bad[1, 2] = float("nan"), float("-inf")
    v = compare({"o": ref * 1.01, "dg": bad, "dq": torch.ones(5)}, {"o": ref, "dg": ref, "dq": ref, "dk": ref})
    assert math.isclose(v.errors["o"], 0.01, rel_tol=1e-5)
    assert math.isnan(v.errors["dg"]) and v.nonfinite == {"dg": 2}
    assert math.isinf(v.errors["dq"]) and math.isinf(v.errors["dk"])  # misshapen, missing: not counted
    assert v.bad == ["dg", "dq", "dk"]
    assert "dg: non-finite (2 NaN/Inf elements)" in v.message() and "dq: inf" in v.message()
    assert compare({"o": ref}, {"o": ref}).nonfinite == {}
    assert nonfinite_count(torch.tensor([1, 2])) == 0 and nonfinite_count(torch.full((4,), math.inf)) == 4
