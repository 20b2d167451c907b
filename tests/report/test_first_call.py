"""The report's "First call per head configuration (s)" section on synthetic results."""

import json

import pandas as pd

from qlabench.report import build_report, render
from qlabench.report.firstcall import fmt_s
from qlabench.report.synthetic import make_results, make_row

SECTION = "First call per head configuration (s)"


def _row(phase, hq, hv, pattern, backend, first_call_s, ts, status="ok", median_ms=1.0):
    r = make_row(phase, hq, hv, pattern, backend, median_ms if status in ("ok", "incorrect") else None,
                 status=status)
    r["first_call_s"] = first_call_s
    r["timestamp"] = ts
    return r


def _ts(sec: int) -> str:
    return f"2026-12-01T00:{sec // 60:02d}:{sec % 60:02d}Z"


def _rows() -> list[dict]:
    return [
        # hk16_hv16: qla's 1x8192 row is later in the file but earlier by timestamp -> its 0.40 s wins
        _row("fwd", 16, 16, "1x32768", "qla", 12.3, _ts(10)),
        _row("fwd", 16, 16, "1x32768", "fla", 5.0, _ts(11), status="error"),  # earliest fla row: error -> "-"
        _row("fwd", 16, 16, "1x32768", "flash_qla", 2.5, _ts(12), status="incorrect"),  # shown: it compiled
        _row("fwd", 16, 16, "1x8192", "qla", 0.40, _ts(5)),
        _row("fwd", 16, 16, "1x8192", "fla", 0.3, _ts(13)),  # later than the error row: not shown
        _row("fwd", 16, 16, "1x8192", "flash_qla", 0.01, _ts(14)),
        # hk16_hv32
        _row("fwd", 16, 32, "1x32768", "qla", 1.20, _ts(20)),
        _row("fwd", 16, 32, "1x32768", "fla", 0.2, _ts(21)),
        _row("fwd", 16, 32, "1x32768", "flash_qla", None, _ts(22), status="unavailable"),
        # hk2_hv8 without timestamps: file order decides (2.00 s, then a 30 s first call of a later row)
        _row("fwd", 2, 8, "1x32768", "qla", 2.0, None),
        _row("fwd", 2, 8, "1x8192", "qla", 30.0, None),
    ]


def _section(text: str) -> str:
    assert SECTION in text or SECTION.upper().replace("(S)", "(s)") in text
    return text.split("First call per head configuration", 1)[1] if SECTION in text else \
        text.split("FIRST CALL PER HEAD CONFIGURATION", 1)[1]


def test_fmt_s():
    assert [fmt_s(x) for x in (12.34, 1.257, 0.471, 0.00466, None)] == ["12.3 s", "1.26 s", "0.47 s", "0.0047 s", "-"]


def test_markdown_section_earliest_row_and_dashes():
    md = render(build_report(make_results(_rows())), "md")
    sec = md.split(f"## {SECTION}", 1)[1]
    assert md.index("### Summary: qla vs peers (fwd)") < md.index(f"## {SECTION}")
    assert "kernel compilation" in sec and "autotuning" in sec and "host clock" in sec
    assert "| Model Config | h_qk | h_v | qla | fla | flash_qla |" in sec
    assert "| hk16_hv16 | 16 | 16 | 0.40 s | - | 2.50 s |" in sec
    assert "| hk16_hv32 | 16 | 32 | 1.20 s | 0.20 s | - |" in sec
    assert "| hk2_hv8 | 2 | 8 | 2.00 s | - | - |" in sec
    assert "- qla: median 1.20 s, max 2.00 s (hk2_hv8) over 3 configurations" in sec
    assert "- fla: median 0.20 s, max 0.20 s (hk16_hv32) over 1 configuration" in sec
    assert "- flash_qla: median 2.50 s, max 2.50 s (hk16_hv16) over 1 configuration" in sec
    # qla's later rows with long first calls (12.3 s, 30 s) are pointed out, not put in the table
    assert "note: qla paid a first call again on a later row in 2 of 3 configurations (up to 30.0 s: hk2_hv8 1x8192" in sec
    assert "\\*" not in sec  # one phase only: nothing ran before in another phase


def test_text_and_html_carry_the_section():
    rep = build_report(make_results(_rows()))
    text = render(rep, "text")
    sec = _section(text)
    line = next(ln for ln in sec.splitlines() if ln.startswith("hk16_hv16"))
    assert line.split() == ["hk16_hv16", "16", "16", "0.40", "s", "-", "2.50", "s"]
    assert "qla: median 1.20 s, max 2.00 s (hk2_hv8) over 3 configurations" in sec
    html = render(rep, "html")
    assert SECTION in html and "0.40 s" in html and "median 1.20 s" in html
    assert "First call" not in render(rep, "csv")


def test_several_files_merge(tmp_path):
    rows = _rows()
    paths = []
    for name, part in (("a.json", rows[:6]), ("b.json", rows[6:])):
        (tmp_path / name).write_text(json.dumps(make_results(part)))
        paths.append(str(tmp_path / name))
    one = render(build_report(make_results(rows)), "md").split(f"## {SECTION}", 1)[1]
    two = render(build_report(paths), "md").split(f"## {SECTION}", 1)[1]
    assert one == two
    # a later file re-running a case replaces that row (dedupe_latest): qla's 1x8192 row now finished
    # after the 1x32768 one, so the 12.3 s call is the configuration's earliest
    again = _row("fwd", 16, 16, "1x8192", "qla", 0.9, _ts(50))
    (tmp_path / "c.json").write_text(json.dumps(make_results([again])))
    three = render(build_report(paths + [str(tmp_path / "c.json")]), "md")
    assert "| hk16_hv16 | 16 | 16 | 12.3 s | - | 2.50 s |" in three


def test_phase_after_another_phase_in_the_same_file_is_marked():
    rows = [
        _row("bwd", 16, 16, "32k_1seq", "qla", 1.3, _ts(1)),
        _row("bwd", 16, 16, "32k_4seq", "qla", 0.01, _ts(2)),
        _row("fwdbwd", 16, 16, "32k_1seq", "qla", 0.005, _ts(3)),
    ]
    md = render(build_report(make_results(rows)), "md")
    sec = md.split(f"## {SECTION}", 1)[1]
    bwd, fwdbwd = sec.split("### Backward (bwd)", 1)[1].split("### Forward+backward (fwdbwd)")
    assert "| hk16_hv16 | 16 | 16 | 1.30 s |" in bwd and "\\*" not in bwd
    assert "| hk16_hv16 | 16 | 16 | 0.0050 s\\* |" in fwdbwd
    assert "already run the configuration in another phase (bwd)" in fwdbwd
    # the same rows from two files (two processes): no mark
    split = build_report([make_results(rows[:2]), make_results(rows[2:])])
    assert "\\*" not in render(split, "md").split(f"## {SECTION}", 1)[1]


def test_no_first_call_omits_the_section():
    rows = _rows()
    for r in rows:  # the schema requires the field: a file without first calls has it null everywhere
        r["first_call_s"] = None
    rep = build_report(make_results(rows))
    assert rep.first_calls == []
    for fmt in ("text", "md", "html"):
        out = render(rep, fmt)
        assert "first call per head" not in out.lower()
    md = render(rep, "md")  # the summary table, the accuracy section (rows carry errors), peak memory ends the page
    assert md.index("### Summary") < md.index("## Accuracy") < md.index("## Peak memory")
    assert "## Per-kernel" not in md and md.rstrip().endswith("over 1.25x")
    # a frame of rows without the column at all
    frame = pd.DataFrame([{k: v for k, v in r.items() if k != "first_call_s"} for r in _rows()])
    rep = build_report(frame)
    assert rep.first_calls == [] and "first call per head" not in render(rep, "md").lower()
