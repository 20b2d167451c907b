"""The report's accuracy section on synthetic results: statistics, failures, drift, formats, plots."""

import json
import math

import matplotlib.image as mpimg
import numpy as np
import pytest
from click.testing import CliRunner

from qlabench.cli import main
from qlabench.report import build_report, render
from qlabench.report.accuracy import build_accuracy
from qlabench.report.plots import write_plots
from qlabench.report.synthetic import _STRESS_BASE, demo_results, make_results, make_row, stress_results


def _section(report, phase):
    return next(s for s in report.accuracy if s.phase == phase)


def _stats(sec, backend, tensor):
    return next(s for s in sec.stats if (s.backend, s.tensor) == (backend, tensor))


def test_per_backend_and_tensor_statistics():
    rep = build_report(stress_results())
    assert [s.phase for s in rep.accuracy] == ["fwd", "bwd"]
    bwd = _section(rep, "bwd")
    assert [(s.backend, s.tensor) for s in bwd.stats][:8] == [("qla", t) for t in
                                                              ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0")]
    dg = _stats(bwd, "fla", "dg")
    # 8 strong-decay cases: 0.03 * i for i = 1, 3, 4, 5, 7, 8 and non-finite at i = 2, 6; 2 variants near 5e-3
    assert (dg.n, dg.n_over, dg.n_nonfinite) == (10, 8, 2)
    assert math.isinf(dg.worst) and dg.worst_case == "hk2_hv16 1x8192 [extreme]"
    assert dg.median == pytest.approx((0.12 + 0.15) / 2)  # sorted: 2 small, .03 .09 .12 | .15 .21 .24 inf inf
    o = _stats(bwd, "qla", "o")
    assert (o.n, o.n_over, o.n_nonfinite) == (10, 0, 0)
    assert o.worst == pytest.approx(_STRESS_BASE["o"] * 1.1) and o.worst_case == "hk2_hv16 1x8192 [qwen beta=near1]"
    fwd = _section(rep, "fwd")
    fq = _stats(fwd, "flash_qla", "o")
    assert (fq.n, fq.n_over, fq.worst) == (22, 6, 0.8)  # 2 padded cases + 4 long drift rows
    assert fq.worst_case == "hk2_hv16 256*1+64*63+64*65+pad1000 [qwen]"
    assert fwd.tolerances == [0.02] and fwd.cases[-1] == "hk2_hv8 1x262144 [qwen]"


def test_failures_name_case_backend_and_tensors():
    bwd = _section(build_report(stress_results()), "bwd")
    assert len(bwd.failures) == 8 and {r.backend for r in bwd.failures} == {"fla"}
    first, second = bwd.failures[:2]
    assert (first.case, first.bad, first.describe("dg")) == ("hk2_hv16 1x8192 [qwen]", ["dg"], "dg 3.00e-02")
    assert second.describe("dg") == "dg non-finite (37 NaN/Inf elements)"


def test_drift_groups_only_long_one_sequence_rows():
    fwd = _section(build_report(stress_results()), "fwd")
    assert [(g.preset, g.inputs, g.lengths[0], g.lengths[-1]) for g in fwd.drift] == [
        ("hk2_hv8", "bench", 8192, 262144), ("hk2_hv8", "qwen", 8192, 262144)]
    g = fwd.drift[0]
    assert g.errors[("flash_qla", "o")][262144] == pytest.approx(_STRESS_BASE["o"] * 1.6**5)
    assert g.errors[("qla", "final_state")][131072] == pytest.approx(_STRESS_BASE["final_state"])
    assert _section(build_report(stress_results()), "bwd").drift == []
    # the speed sweeps' 2k-32k one-sequence patterns are no drift group (they never reach 64k tokens)
    assert all(not s.drift for s in build_report(demo_results()).accuracy)


def test_text_markdown_html_render_the_section():
    rep = build_report(stress_results())
    text = render(rep, "text")
    acc = text.split(">>> ACCURACY", 1)[1].split(">>> FIRST CALL", 1)[0]
    fla_dg = next(ln for ln in acc.splitlines() if ln.split()[:2] == ["fla", "dg"])
    assert fla_dg.split()[2:5] == ["10", "1.35e-01", "non-finite"] and fla_dg.split()[-2:] == ["8", "2"]
    assert "Over tolerance or non-finite: 8 of 30 checked rows:" in acc
    assert "hk2_hv16 128*63+128*65 [extreme]" in acc and "dg non-finite (37 NaN/Inf elements)" in acc
    assert "-- Forward (fwd), tolerance 0.02" in acc and "262144" in acc.split("Drift with sequence length")[1]
    md = render(rep, "md", plots={"accuracy_bwd": ["p/accuracy_bwd.png"]})
    assert "## Accuracy (relative L2 against the float64 reference)" in md
    assert "| fla | dg | 10 | 1.35e-01 | non-finite | hk2_hv16 1x8192 [extreme] | 8 | 2 |" in md
    assert "| hk2_hv16 512\\*1 [qwen] | fla | dg 9.00e-02 |" not in md  # md_row escapes only |
    assert "| hk2_hv16 512*1 [qwen] | fla | dg 9.00e-02 |" in md
    assert md.index("### Backward (bwd)", md.index("## Accuracy")) < md.index("![p/accuracy_bwd.png]")
    html = render(rep, "html")
    assert "<h2>Accuracy (relative L2 against the float64 reference)</h2>" in html
    assert "<td class='bad'>non-finite</td>" in html and "37 NaN/Inf elements" in html


def test_speed_tables_show_inputs_and_flag_incorrect_rows():
    text = render(build_report(stress_results()), "text")
    head = next(ln for ln in text.splitlines() if ln.startswith("Model Config") and "SeqLen" in ln)
    assert head.split()[:5] == ["Model", "Config", "SeqLen", "Inputs", "h_qk"]
    line = next(ln for ln in text.splitlines() if "1x8192" in ln and "qwen beta=near1" in ln)
    assert "0.300ms" in line
    bwd = text.split(">>> BACKWARD BENCHMARKS", 1)[1].split("====", 1)[0]
    row = next(ln for ln in bwd.splitlines() if ln.startswith("hk2_hv16") and "extreme" in ln).split()
    assert row[6:9] == ["0.900ms", "1.080ms!", "0.600ms"] and row[9] == "-"  # no speedup over a wrong fla
    md = render(build_report(stress_results()), "md")
    # the incorrect fla rows are out of the geomean: 2 compared, 8 not
    assert "| overall | fla | 2 |" in md.split("### Summary: qla vs peers (bwd)", 1)[1]
    assert "Inputs" not in render(build_report(demo_results()), "text")


def test_old_rows_without_counts_or_recipe_and_null_errors():
    rows = [make_row("bwd", 2, 4, "1x8192", "fla", 1.0, status="incorrect",
                     errors={"o": 1e-3, "dg": None, "dq": float("inf")}),
            make_row("bwd", 2, 4, "1x8192", "qla", 1.0, errors={"o": 2e-3, "dg": 3e-3, "dq": 1e-3})]
    for r in rows:
        for k in ("nonfinite", "beta_profile", "h0_scale", "pad_tokens"):
            del r[k]
    sec = build_report(make_results(rows)).accuracy[0]
    fla = next(r for r in sec.rows if r.backend == "fla")
    assert fla.case == "hk2_hv4 1x8192 [bench]" and fla.bad == ["dq", "dg"]
    assert fla.describe("dg") == "dg non-finite" and _stats(sec, "fla", "dq").n_nonfinite == 1
    assert [s.tensor for s in sec.stats if s.backend == "qla"] == ["o", "dq", "dg"]


def test_tolerance_per_file_and_no_section_without_errors(tmp_path):
    loose = make_results([make_row("fwd", 2, 4, "1x8192", "qla", 1.0, errors={"o": 0.015})])
    strict = make_results([make_row("fwd", 2, 4, "1x4096", "qla", 1.0, errors={"o": 0.015})])
    strict["run"]["tolerance"] = 0.01
    paths = []
    for name, doc in (("loose.json", loose), ("strict.json", strict)):
        (tmp_path / name).write_text(json.dumps(doc))
        paths.append(str(tmp_path / name))
    sec = build_report(paths).accuracy[0]
    assert sec.tolerances == [0.01, 0.02] and [r.case for r in sec.failures] == ["hk2_hv4 1x4096 [bench]"]
    assert "tolerance 0.01, 0.02 (the files differ)" in render(build_report(paths), "text")
    bare = make_results([make_row("fwd", 2, 4, "1x8192", "qla", 1.0, errors={})])
    rep = build_report(bare)
    assert rep.accuracy == [] and "ACCURACY" not in render(rep, "text") and "Accuracy" not in render(rep, "md")
    assert build_accuracy(rep.collected.df, ["fwd"], ["qla"]) == []


def test_median_ranks_non_finite_worst():
    rows = [make_row("fwd", 1, 1, p, "x", 1.0, status="incorrect" if e is None else "ok", errors={"o": e})
            for p, e in (("1x64", 1e-3), ("1x128", None), ("1x256", None))]
    st = build_report(make_results(rows)).accuracy[0].stats[0]
    assert math.isinf(st.median) and st.n_nonfinite == 2 and st.worst_case == "hk1_hv1 1x128 [bench]"


def _non_blank(path) -> bool:
    img = mpimg.imread(path)[..., :3]
    ink = (img.mean(axis=-1) < 0.9).mean()
    return len(np.unique(img.reshape(-1, 3), axis=0)) > 50 and ink > 0.01


def test_accuracy_and_drift_plots(tmp_path):
    made = write_plots(build_report(stress_results()), tmp_path)
    assert made["accuracy_fwd"] == ["accuracy_fwd.png", "drift_fwd.png"]
    assert made["accuracy_bwd"] == ["accuracy_bwd.png"]  # no long one-sequence backward rows
    for name in made["accuracy_fwd"] + made["accuracy_bwd"]:
        assert (tmp_path / name).stat().st_size > 10_000 and _non_blank(tmp_path / name), name
    demo = write_plots(build_report(demo_results()), tmp_path / "demo")
    assert demo["accuracy_fwd"] == ["accuracy_fwd.png"] and demo["fwd"][0] == "speedup_fwd.png"


def test_report_command_renders_accuracy_and_plots(tmp_path):
    src = tmp_path / "stress.json"
    src.write_text(json.dumps(stress_results()))
    runner = CliRunner()
    res = runner.invoke(main, ["report", str(src)], catch_exceptions=False)
    assert res.exit_code == 0 and ">>> ACCURACY" in res.output and "Drift with sequence length" in res.output
    plots = tmp_path / "plots"
    res = runner.invoke(main, ["report", str(src), "--format", "md", "--plots", str(plots)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    md = (plots / "REPORT.md").read_text()
    assert "![accuracy_bwd.png](accuracy_bwd.png)" in md and "![drift_fwd.png](drift_fwd.png)" in md
    assert (plots / "drift_fwd.png").is_file()
    html = runner.invoke(main, ["report", str(src), "--format", "html"], catch_exceptions=False).output
    assert "<h2>Accuracy" in html
