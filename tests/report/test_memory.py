"""The report's peak-memory section, from synthetic rows with `peak_mem_mb`."""

from __future__ import annotations

import pandas as pd

from qlabench import results as R
from qlabench.report import memory
from qlabench.report.synthetic import make_results, make_row
from qlabench.report.tables import build_report, render


def _row(phase, backend, mib, pattern="1x32768", status="ok"):
    r = make_row(phase, 16, 16, pattern, backend, 1.0)
    r["peak_mem_mb"] = mib
    if status != "ok":
        r["status"] = status
    return r


def _results():
    return make_results([
        _row("bwd", "qla", 1126.0), _row("bwd", "flash_qla", 663.0), _row("bwd", "fla", 1671.0),
        _row("bwd", "qla", 263.0, "8192x4"), _row("bwd", "flash_qla", 250.0, "8192x4"),
        _row("bwd", "fla", None, "8192x4"),  # a backend without a value: `-`, no ratio
        _row("fwdbwd", "qla", 1481.0), _row("fwdbwd", "flash_qla", 872.0),
    ])


def test_tables_ratios_and_summary():
    rep = build_report(R.validate(_results()))
    bwd, fwdbwd = rep.memory
    assert (bwd.phase, bwd.subject, bwd.peers) == ("bwd", "qla", ["flash_qla", "fla"])  # the report's peer order
    assert [c.split()[1] for c in bwd.cases] == ["1x32768", "8192x4"]
    big = bwd.cases[0]
    assert abs(bwd.ratio(big, "flash_qla") - 1126 / 663) < 1e-12 and bwd.ratio(bwd.cases[1], "fla") is None
    assert bwd.summary("flash_qla") == (2, 1126 / 663, big, 1)  # 263 / 250 = 1.05x is under 1.25x
    assert bwd.summary("fla") == (1, 1126 / 1671, big, 0)
    assert fwdbwd.peers == ["flash_qla"] and fwdbwd.summary("flash_qla")[3] == 1


def test_each_format_carries_the_section():
    rep = build_report(R.validate(_results()))
    text = render(rep, "text")
    assert "PEAK MEMORY (MIB)" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("hk16_hv16 8192x4"))
    assert line.split()[-5:] == ["263", "250", "-", "1.05x", "-"]
    assert "qla vs flash_qla: 2 cases, largest 1.70x (hk16_hv16 1x32768 [bench]), 1 over 1.25x" in text
    md = render(rep, "md")
    assert "## Peak memory (MiB)" in md and "| case | qla | flash_qla | fla | qla / flash_qla | qla / fla |" in md
    assert md.index("## Accuracy") < md.index("## Peak memory")
    html = render(rep, "html")
    assert "<h2>Peak memory (MiB)</h2>" in html and "1.70x" in html


def test_rows_without_a_peak_omit_the_section():
    rows = _results()["rows"]
    for r in rows:
        r["peak_mem_mb"] = None
    rep = build_report(make_results(rows))
    assert rep.memory == []
    assert all("peak memory" not in render(rep, fmt).lower() for fmt in ("text", "md", "html"))
    frame = pd.DataFrame([{k: v for k, v in r.items() if k != "peak_mem_mb"} for r in rows])
    assert memory.build_memory(frame, ["bwd"], "qla", ["fla"]) == []


def test_failed_rows_take_no_part():
    rows = [_row("bwd", "qla", 900.0), _row("bwd", "flash_qla", 100.0, status="error")]
    (t,) = build_report(make_results(rows)).memory
    assert t.peers == [] and t.summary("flash_qla") == (0, None, None, 0)
