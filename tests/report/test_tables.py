"""Report tables on a synthetic results file: values, grouping, status words, formats."""

import csv
import io
import json
import re

import pytest

from qlabench.report import ResultsError, build_report, format_h200_tables, render
from qlabench.report.synthetic import demo_results, make_results, make_row


def _table_lines(text: str, title: str) -> list[str]:
    block = text.split(f">>> {title} BENCHMARKS", 1)[1]
    block = block.split("====", 1)[0]
    return block.splitlines()[3:]  # after header and rule


def test_forward_table_values_and_speedups():
    text = format_h200_tables(demo_results())
    assert "GPU: NVIDIA H200" in text and "Timer=cudagraph" in text and "Warmup=10" in text
    assert "fla: 0.6.0" in text and "flash_qla: 0.1.3" in text
    head = next(ln for ln in text.splitlines() if ln.startswith("Model Config"))
    assert "qla [fwd]" in head and "vs fla" in head and "vs flash_qla" in head
    row = next(ln for ln in text.splitlines() if ln.startswith("2B/0.8B TP1") and "1x32768" in ln)
    cells = row.split()
    # qla 0.378, fla 1.231 -> 1.231 / 0.378 = 3.2566 -> "3.26x"; flash_qla 0.380 / 0.378 -> 1.01x
    assert cells[5:10] == ["0.378ms", "1.231ms", "0.380ms", "3.26x", "1.01x"]


def test_presets_grouped_with_blank_lines():
    lines = _table_lines(format_h200_tables(demo_results()), "FORWARD")
    blank = [i for i, ln in enumerate(lines) if not ln.strip()]
    first_group = lines[: blank[0]]
    assert all(ln.startswith("2B/0.8B TP1") for ln in first_group) and len(first_group) == 5
    assert lines[blank[0] + 1].startswith("35B/9B/4B TP1")


def test_incorrect_keeps_its_time_flagged_and_no_row_but_ok_has_a_speedup():
    text = format_h200_tables(demo_results())
    row = next(ln for ln in text.splitlines() if "1x2048" in ln).split()
    # qla incorrect: its time shows, flagged; flash_qla error: the word
    assert row[5] == "0.050ms!" and row[7] == "error"
    assert row[8] == "-" and row[9] == "-"
    fwd = text.split(">>> FORWARD BENCHMARKS", 1)[1].split("====", 1)[0]
    assert "! incorrect: an output over the tolerance or non-finite" in fwd and "geomeans" in fwd
    assert "! incorrect" not in text.split(">>> BACKWARD BENCHMARKS", 1)[1].split("====", 1)[0]
    # the summary leaves the incorrect case out: 8 compared of 9
    md = render(build_report(demo_results()), "md")
    assert "| overall | fla | 8 |" in md and "0.050ms!" in md and "no part in speedups" in md
    bwd = _table_lines(text, "BACKWARD")
    assert all("unavailable" in ln for ln in bwd if ln.strip())
    first = bwd[0].split()
    assert first[:5] == ["hk16_hv16", "32k_1seq", "16", "16", "1"]
    assert first[8] == f"{3.558 / 0.95:.2f}x"


def test_backward_single_peer_uses_speedup_header():
    text = format_h200_tables(demo_results(), peers=["fla"])
    head = next(ln for ln in text.splitlines() if ln.startswith("Model Config") and "SeqLen" in ln)
    assert "Speedup" in head.split() and "vs fla" not in head and "#seq" in head


def test_subject_default_and_override():
    assert build_report(demo_results()).subject == "qla"
    rows = [make_row("fwd", 2, 8, "1x8192", "fla", 0.3), make_row("fwd", 2, 8, "1x8192", "qla", 0.2,
                                                                      status="incorrect")]
    assert build_report(make_results(rows)).subject == "fla"  # qla has no ok row
    text = format_h200_tables(demo_results(), subject="fla", peers=["qla"])
    row = next(ln for ln in text.splitlines() if ln.startswith("2B/0.8B TP1") and "1x32768" in ln)
    assert row.split()[-3] == f"{0.378 / 1.231:.2f}x"


def test_bad_subject_and_bad_file(tmp_path):
    with pytest.raises(ValueError, match="'nope'"):
        build_report(demo_results(), subject="nope")
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"schema": "other/1", "rows": []}))
    with pytest.raises(ResultsError, match="other/1"):
        build_report([str(p)])


def test_roofline_columns_only_for_known_gpu():
    text = format_h200_tables(demo_results())
    row = next(ln for ln in text.splitlines() if ln.startswith("2B/0.8B TP1") and "1x32768" in ln)
    # fwd (16,16) T=32768: 86.97 GFLOP / 0.378 ms = 230.1 TFLOP/s; floor 126.3 us -> 2.99x
    assert row.split()[-2:] == ["230.1", "2.99x"]
    other = format_h200_tables(demo_results("Some Future GPU"))
    assert "TFLOP/s" not in other and "no peak figures for GPU 'Some Future GPU'" in other


def test_markdown_csv_html_carry_the_same_content():
    rep = build_report(demo_results())
    md = render(rep, "md")
    assert "| 2B/0.8B TP1 | 1x32768 | 16 | 16 | 0.378ms | 1.231ms | 0.380ms | 3.26x | 1.01x |" in md
    assert "### Summary: qla vs peers (fwd)" in md and "| overall | fla | 8 |" in md
    # the summary's geomean to three places (a criterion such as 3x must not be met by rounding)
    overall = next(ln for ln in md.splitlines() if ln.startswith("| overall | fla | 8 |")).split("|")
    assert re.fullmatch(r"\d+\.\d{3}x", overall[4].strip()), overall
    rows = list(csv.DictReader(io.StringIO(render(rep, "csv"))))
    r = next(x for x in rows if x["phase"] == "fwd" and x["pattern"] == "1x32768" and x["h_v"] == "16")
    assert r["qla_ms"] == "0.378" and float(r["vs_fla"]) == pytest.approx(1.231 / 0.378, rel=1e-3)
    bad = next(x for x in rows if x["pattern"] == "1x2048")
    assert bad["qla_ms"] == "0.050" and bad["qla_status"] == "incorrect" and bad["vs_fla"] == ""
    assert bad["flash_qla_ms"] == "error" and bad["fla_status"] == "ok" and bad["inputs"] == "bench"
    html = render(rep, "html")
    assert "<table>" in html and "<td class='bad'>0.050ms!</td>" in html and "3.26x" in html
    assert "no part in speedups" in html


def test_several_files_combine(tmp_path):
    r = demo_results()
    fwd = make_results([x for x in r["rows"] if x["phase"] == "fwd"])
    bwd = make_results([x for x in r["rows"] if x["phase"] == "bwd"])
    paths = []
    for name, doc in (("f.json", fwd), ("b.json", bwd)):
        (tmp_path / name).write_text(json.dumps(doc))
        paths.append(str(tmp_path / name))
    text = format_h200_tables(paths)
    assert ">>> FORWARD BENCHMARKS" in text and ">>> BACKWARD BENCHMARKS" in text
    assert build_report(paths, phases=["bwd"]).tables[0].phase == "bwd"


def test_header_of_files_measured_differently(tmp_path):
    """Two files with other run settings and library sets: the header names each file's settings and
    every library version (a peer's version from the second file, both values where they differ)."""
    r = demo_results()
    first = make_results([x for x in r["rows"] if x["backend"] != "fla"], versions={"fla": "0.5.1"})
    second = make_results([x for x in r["rows"] if x["backend"] == "fla"], versions={"flashinfer": "0.7.2"})
    second["run"]["warmup"], second["run"]["repeats"] = 5, 30
    paths = []
    for name, doc in (("a.json", first), ("b.json", second)):
        (tmp_path / name).write_text(json.dumps(doc))
        paths.append(str(tmp_path / name))
    header = render(build_report(paths), "md").split("## ")[0]
    config = next(line for line in header.splitlines() if line.startswith("- Config: "))
    assert "Warmup=5, Repeats=30" in config and "Warmup=10, Repeats=100" in config and "(" + paths[0] + ")" in config and paths[1] in config, config
    versions = next(line for line in header.splitlines() if line.startswith("- Library Versions: "))
    assert "flashinfer: 0.7.2" in versions and "fla: 0.5.1 / 0.6.0" in versions, versions
    # files measured alike: one Config entry, as before
    same = render(build_report([paths[0], paths[0]]), "md").split("## ")[0]
    assert "; " not in next(line for line in same.splitlines() if line.startswith("- Config: "))
