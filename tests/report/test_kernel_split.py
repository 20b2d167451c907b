"""The report's per-kernel split section, from synthetic rows with `kernel_split`."""

from __future__ import annotations

from qlabench import results as R
from qlabench.report import kernelsplit
from qlabench.report.synthetic import make_results, make_row
from qlabench.report.tables import build_report, render

QLA = {"kkt_solve_kernel": 120.0, "chunk_fwd_ws_kernel": 800.0, "chunk_local_cumsum_kernel": 10.0}
QLA_CP = {"kkt_solve_kernel": 121.0, "chunk_fwd_pipelined_kernel": 500.0, "cp_correction": 90.0,
          "chunk_local_cumsum_kernel": 10.0}
FLA = {"chunk_gated_delta_rule_fwd_kernel_h": 700.0, "recompute_w_u_fwd_kernel": 200.0}


def _row(backend, median_ms, split=None, pattern="1x32768", options=None):
    r = make_row("fwd", 16, 16, pattern, backend, median_ms)
    if split is not None:
        r["kernel_split"] = split
    if options is not None:
        r["options"] = options
    return r


def _results():
    return make_results([
        _row("qla", 0.95, QLA, options={"cp": "auto", "fwd_kernel": "auto", "bwd_dh": "auto"}),
        _row("qla:cp=on", 0.74, QLA_CP, options={"cp": "on", "fwd_kernel": "auto", "bwd_dh": "auto"}),
        _row("fla", 0.91, FLA),
        _row("qla", 0.30, None, pattern="8192x4"),  # a case without a split: no table
        _row("fla", 0.40, None, pattern="8192x4"),
    ])


def test_tables_put_backends_side_by_side():
    res = R.validate(_results())
    (t,) = build_report(res).kernel_split
    assert t.phase == "fwd" and t.case.startswith("hk16_hv16 1x32768")
    assert t.backends == ["qla", "qla:cp=on", "fla"]
    assert t.kernels[0] == "chunk_fwd_ws_kernel"  # largest first, over every backend
    assert set(t.kernels) == set(QLA) | set(QLA_CP) | set(FLA)
    assert t.us[("kkt_solve_kernel", "qla")] == 120.0 and t.us[("kkt_solve_kernel", "qla:cp=on")] == 121.0
    assert ("cp_correction", "qla") not in t.us
    assert t.sums == {"qla": 930.0, "qla:cp=on": 721.0, "fla": 900.0}
    assert t.medians["qla:cp=on"] == 740.0


def test_each_format_carries_the_section():
    rep = build_report(R.validate(_results()))
    text = render(rep, "text")
    assert "PER-KERNEL SPLIT" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("kkt_solve_kernel"))
    assert line.split() == ["kkt_solve_kernel", "120.0", "121.0", "-"]
    sums = next(ln for ln in text.splitlines() if ln.startswith("sum "))
    assert sums.split() == ["sum", "930.0", "721.0", "900.0"]
    md = render(rep, "md")
    assert "## Per-kernel split (us per call)" in md
    assert "| kernel | qla | qla:cp=on | fla |" in md
    assert "| cp_correction | - | 90.0 | - |" in md
    html = render(rep, "html")
    assert "Per-kernel split" in html and "<td class=''>90.0</td>" in html


def test_many_kernels_fold_into_other():
    split = {f"k{i:02d}": float(100 - i) for i in range(kernelsplit.MAX_KERNELS + 3)}
    res = make_results([_row("torch", 1.0, split)])
    (t,) = build_report(R.validate(res)).kernel_split
    assert len(t.kernels) == kernelsplit.MAX_KERNELS + 1 and t.kernels[-1] == "(other 3 kernels)"
    assert t.us[("(other 3 kernels)", "torch")] == sum(100.0 - i for i in range(12, 15))
    assert t.sums["torch"] == sum(split.values())


def test_no_split_no_section():
    res = make_results([_row("qla", 1.0), _row("fla", 1.2)])
    rep = build_report(R.validate(res))
    assert rep.kernel_split == []
    assert "PER-KERNEL" not in render(rep, "text") and "Per-kernel" not in render(rep, "md")


def test_results_validate_the_split():
    bad = make_results([_row("qla", 1.0, {"kkt": -1.0})])
    try:
        R.validate(bad)
    except R.ResultsError as e:
        assert "kernel_split" in str(e)
    else:
        raise AssertionError("a negative kernel time was accepted")
