"""Bad inputs and lost results: every case of the issue "a gate that cannot pass on bad data, results
that cannot be lost", each through the CLI (click's CliRunner) with its exit code and one-line message.

Results files are synthetic (qlabench/report/synthetic.py); the sweeps run the CPU `torch` reference
backend on tiny patterns.
"""

from __future__ import annotations

import json
import math
import time

import pytest
from click.testing import CliRunner

from qlabench import results as R
from qlabench.cli import main
from qlabench.report.synthetic import make_results, make_row

PATTERNS = ("1x2048", "1x4096", "1x8192", "1x16384", "1x32768", "2048x4", "4096x4", "8192x2", "16384x2",
            "28672+4096")


def _invoke(*args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], **kw)


def _one_line_error(res, code: int, *needles: str) -> str:
    """The command exited ``code`` with exactly one line of output, containing every needle."""
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == code, res.output
    assert len(lines) == 1, res.output
    assert "Traceback" not in res.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _rows(backends=("qla", "fla"), patterns=PATTERNS, qla_ms=1.0, fla_ms=3.0):
    times = {"qla": qla_ms, "fla": fla_ms}
    return [make_row("fwd", 16, 16, p, b, times[b]) for p in patterns for b in backends]


def _write(path, doc, allow_nan=False):
    path.write_text(json.dumps(doc, allow_nan=allow_nan))
    return path


@pytest.fixture
def base(tmp_path):
    return _write(tmp_path / "base.json", make_results(_rows()))


# ---- the gate cannot pass on bad data --------------------------------------------------------------


@pytest.mark.parametrize("value, needle", [
    (math.nan, "median_ms = nan"),
    (0, "median_ms = 0"),
    ("0.5", "median_ms = '0.5'"),
    (True, "median_ms = True"),
    (-1.0, "median_ms = -1.0"),
    (1e308, "median_ms = 1e+308"),
], ids=["nan", "zero", "string", "true", "negative", "huge"])
def test_gate_rejects_a_bad_median(tmp_path, base, value, needle):
    doc = make_results(_rows())
    doc["rows"][0]["median_ms"] = value
    cur = _write(tmp_path / "cur.json", doc, allow_nan=True)
    line = _one_line_error(_invoke("gate", cur, "--baseline", base), 2, "cannot compare", "rows[0]", needle)
    assert str(cur) in line
    _one_line_error(_invoke("gate", cur, "--min-speedup", "qla/fla=2.5"), 2, needle)


def test_gate_fails_when_baseline_rows_are_missing(tmp_path, base):
    cur = _write(tmp_path / "cur.json", make_results(_rows(patterns=PATTERNS[:1])))  # 1 of the 10 qla rows
    res = _invoke("gate", cur, "--baseline", base)
    assert res.exit_code == 1, res.output
    assert "GATE: FAIL" in res.output
    missing = [ln for ln in res.output.splitlines() if "FAIL" in ln and "missing from" in ln]
    assert len(missing) == 9
    assert any("fwd hk16_hv16 28672+4096 [bench] qla: in the baseline, missing from" in ln for ln in missing)
    # every row there: pass
    same = _write(tmp_path / "same.json", make_results(_rows()))
    assert _invoke("gate", same, "--baseline", base).exit_code == 0


def test_gate_min_speedup_with_an_absurd_peer_time(tmp_path):
    cur = _write(tmp_path / "cur.json", make_results(_rows(fla_ms=1e308)))
    _one_line_error(_invoke("gate", cur, "--min-speedup", "qla/fla=2.5"), 2, "median_ms = 1e+308",
                    "outside [1e-06, 3.6e+06] ms")


def test_empty_results_file_is_a_clear_error_everywhere(tmp_path, base):
    empty = _write(tmp_path / "empty.json", make_results([]))  # what a Ctrl-C before the first row leaves
    _one_line_error(_invoke("gate", empty, "--baseline", base), 2, "no rows")
    _one_line_error(_invoke("gate", base, "--baseline", empty), 2, "no rows")
    _one_line_error(_invoke("report", empty), 2, "no rows", str(empty))
    _one_line_error(_invoke("compare", base, empty), 2, "no rows")
    hist = tmp_path / "hist"
    hist.mkdir()
    _write(hist / "empty.json", make_results([]))
    res = _invoke("history", hist)
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "history: skipped" in res.output and "no rows" in res.output
    assert res.output.splitlines()[-1].startswith("qlabench: error: history: no qlabench results files with rows")


@pytest.mark.parametrize("field, value", [
    ("backend", None), ("backend", 3), ("h_qk", "16"), ("h_v", 0), ("phase", "sideways"), ("status", None),
    ("pattern", ""),
])
def test_untyped_key_fields_are_rejected(tmp_path, base, field, value):
    doc = make_results(_rows())
    doc["rows"][3][field] = value
    cur = _write(tmp_path / "cur.json", doc)
    _one_line_error(_invoke("gate", cur, "--baseline", base), 2, f"rows[3].{field} = {value!r}")
    _one_line_error(_invoke("report", cur), 2, f"rows[3].{field}")
    _one_line_error(_invoke("compare", base, cur), 2, f"rows[3].{field}")


def test_malformed_files_are_one_line_errors(tmp_path, base):
    cases = {
        "garbage.json": ("{not json", "not valid JSON"),
        "list.json": ("[1, 2]", "expected a JSON object"),
        "schema.json": (json.dumps({"schema": "other/1"}), "schema is 'other/1'"),
        "rows.json": (json.dumps({**make_results([]), "rows": {"a": 1}}), "'rows' must be a list"),
        "rowtype.json": (json.dumps({**make_results([]), "rows": [17]}), "rows[0] is not an object"),
    }
    for name, (text, needle) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        _one_line_error(_invoke("gate", path, "--baseline", base), 2, needle)
        _one_line_error(_invoke("report", path), 2, needle)
    doc = make_results(_rows())
    doc["rows"].append(dict(doc["rows"][0]))
    dup = _write(tmp_path / "dup.json", doc)
    _one_line_error(_invoke("gate", dup, "--baseline", base), 2, "rows[0] and rows[20] are the same case")


def test_unexpected_error_in_gate_is_exit_2(tmp_path, base, monkeypatch):
    import qlabench.gate

    def broken(*a, **kw):
        raise RuntimeError("something nobody expected")

    monkeypatch.setattr(qlabench.gate, "gate", broken)
    _one_line_error(_invoke("gate", base, "--baseline", base), 2, "gate: error: RuntimeError: something nobody")


# ---- report and plots never overwrite inputs or leave their folder ---------------------------------


def test_report_refuses_to_overwrite_its_input(tmp_path, base):
    before = base.read_bytes()
    _one_line_error(_invoke("report", base, "--out", base), 2, "refusing to overwrite", str(base))
    _one_line_error(_invoke("report", base, "--out", tmp_path / "." / "base.json"), 2, "refusing to overwrite")
    assert base.read_bytes() == before and R.load(base)["rows"]
    # --plots DIR --format md writes DIR/REPORT.md: not when that is an input
    plots = tmp_path / "plots"
    plots.mkdir()
    report_md = _write(plots / "REPORT.md", make_results(_rows()))
    _one_line_error(_invoke("report", report_md, "--plots", plots, "--format", "md"), 2, "refusing to overwrite")
    res = _invoke("report", base, "--out", tmp_path / "nodir" / "r.md")
    _one_line_error(res, 2, "report: cannot write")


def test_plot_names_from_backends_stay_in_the_folder(tmp_path):
    evil = "x/../../../escaped"
    doc = make_results(_rows(backends=("qla",)) + [make_row("fwd", 16, 16, p, evil, 2.0) for p in PATTERNS])
    (tmp_path / "a" / "b").mkdir(parents=True)
    src = _write(tmp_path / "a" / "b" / "evil.json", doc)
    plots = tmp_path / "a" / "b" / "plots"
    res = _invoke("report", src, "--plots", plots)
    assert res.exit_code == 0, res.output
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["a/b/evil.json", "a/b/plots/heatmap_fwd_vs_x__________escaped.png",
                       "a/b/plots/latency_fwd.png", "a/b/plots/speedup_fwd.png"]


# ---- history is linear in rows -------------------------------------------------------------------


def test_history_of_a_large_file_is_fast(tmp_path):
    # 24k rows in one file (8k cases x 3 backends); the quadratic version took ~52 s for 8k rows
    rows = [make_row("fwd", 16, 16, f"1x{1024 + i}", b, t) for i in range(8000)
            for b, t in (("qla", 1.0), ("fla", 2.0), ("torch", 9.0))]
    d = tmp_path / "hist"
    d.mkdir()
    _write(d / "big.json", make_results(rows))
    t0 = time.monotonic()
    res = _invoke("history", d, "--cfg", " 1x1024 [")
    elapsed = time.monotonic() - t0
    assert res.exit_code == 0, res.output
    assert "1 runs on NVIDIA H200" in res.output and "fwd hk16_hv16 1x1024 [bench]" in res.output
    assert elapsed < 20, f"history of 24k rows took {elapsed:.1f} s"
