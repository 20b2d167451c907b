"""Step detection and attribution on a constructed history."""

import json

import pytest
from click.testing import CliRunner

from qlabench.cli import main
from qlabench.history import build_history, detect_steps, load_runs
from qlabench.report.synthetic import make_results, make_row


def test_detect_sustained_step_ignores_outlier():
    series = [1.00, 1.01, 0.99, 1.30, 1.00, 1.00, 1.20, 1.21, 1.19, 1.20]
    steps = detect_steps(series, [0.01] * len(series))
    assert [(s.index, s.confirmed) for s in steps] == [(6, True)]
    assert steps[0].change == pytest.approx(0.20, abs=0.01)


def test_detect_unconfirmed_and_noise_threshold():
    steps = detect_steps([1.0, 1.0, 1.0, 1.0, 1.3])
    assert [(s.index, s.confirmed) for s in steps] == [(4, False)]
    # a 10% shift inside 5% dispersion (threshold 3 x 5% = 15%) is not a step
    assert detect_steps([1.0, 1.0, 1.1, 1.1, 1.1], [0.05] * 5) == []
    assert [s.index for s in detect_steps([1.0, 1.0, 1.1, 1.1, 1.1], [0.005] * 5)] == [2]
    assert [s.index for s in detect_steps([1.0, None, 1.0, 0.8, 0.8])] == [3]


def _history_dir(tmp_path):
    # runs 0-2 baseline; run 3: fla 0.6.0 -> 0.7.0 and fla gets faster (baseline moved);
    # runs 5-6: our own time goes up 20% with no version change (we regressed).
    qla = [1.0, 1.0, 1.0, 1.0, 1.0, 1.2, 1.2]
    fla = [3.0, 3.0, 3.0, 2.4, 2.4, 2.4, 2.4]
    for i, (q, f) in enumerate(zip(qla, fla)):
        ver = "0.6.0" if i < 3 else "0.7.0"
        rows = [make_row("fwd", 16, 16, "1x32768", "qla", q, backend_version="0.1.0"),
                make_row("fwd", 16, 16, "1x32768", "fla", f, backend_version=ver),
                make_row("fwd", 2, 8, "1x8192", "qla", 0.2), make_row("fwd", 2, 8, "1x8192", "fla", 0.5)]
        doc = make_results(rows, timestamp=f"2026-12-0{i + 1}T00:00:00Z", git_commit=f"c{i}",
                           versions={"fla": ver})
        d = tmp_path / f"run{i}"
        d.mkdir()
        (d / "results.json").write_text(json.dumps(doc))
    (tmp_path / "notes.json").write_text("{}")  # not a results file: skipped
    return tmp_path


def test_history_attribution(tmp_path):
    runs = load_runs(_history_dir(tmp_path))
    assert [r.commit for r in runs] == [f"c{i}" for i in range(7)]
    hist = build_history(runs, cfg=["hk16_hv16"])
    assert len(hist) == 1
    h = hist[0]
    assert h.ratios["fla"][0] == pytest.approx(3.0) and h.ratios["fla"][-1] == pytest.approx(2.0)
    assert sorted(h.step_runs) == [3, 5]
    text = " | ".join(h.events)
    assert "baseline moved (fla 0.6.0 -> 0.7.0)" in text
    assert "we regressed" in text and "+20.0%" in text
    quiet = build_history(runs, cfg=["hk2_hv8"])[0]
    assert quiet.events == [] and quiet.step_runs == []


def test_history_cli_and_plot(tmp_path):
    d = _history_dir(tmp_path)
    out = tmp_path / "hist.png"
    r = CliRunner().invoke(main, ["history", str(d), "--cfg", "1x32768", "--plot", str(out)])
    assert r.exit_code == 0, r.output
    assert "7 runs on NVIDIA H200" in r.output and "<- step" in r.output and "baseline moved" in r.output
    assert out.stat().st_size > 10_000
    r = CliRunner().invoke(main, ["history", str(tmp_path / "run0" / "results.json")])
    assert r.exit_code == 2
    deep = tmp_path / "new" / "folder" / "hist.png"  # its folder is made (docs/cli.md's example: runs/...)
    r = CliRunner().invoke(main, ["history", str(d), "--cfg", "1x32768", "--plot", str(deep)])
    assert r.exit_code == 0 and deep.stat().st_size > 10_000, r.output
    r = CliRunner().invoke(main, ["history", str(d), "--cfg", "1x32768", "--plot", str(out / "under-a-file.png")])
    assert r.exit_code == 2 and "qlabench: error: history: cannot write" in r.output, r.output


def test_history_refuses_mixed_gpus(tmp_path):
    d = _history_dir(tmp_path)
    doc = make_results([make_row("fwd", 16, 16, "1x32768", "qla", 1.0)], gpu_name="NVIDIA B200")
    (d / "b200.json").write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["history", str(d)])
    assert r.exit_code == 2 and "mixes GPU models" in r.output
    r = CliRunner().invoke(main, ["history", str(d), "--gpu", "H200"])
    assert r.exit_code == 0, r.output


def test_history_timeline_copies_variants_cpu_and_commit_width(tmp_path):
    """A baseline copied from a run counts once; *.ab.json files and rows with kernel options stay out
    unless --variants; a CPU run stays out; commits print 7 wide whether stored full or short."""
    d = _history_dir(tmp_path)
    ci = json.loads((d / "run6" / "results.json").read_text())
    (d / "baselines").mkdir()
    ci["rows"] = [r for r in ci["rows"] if r["backend"] == "qla"]  # baseline update --backends qla
    (d / "baselines" / "h200.json").write_text(json.dumps(ci))
    ab = make_results([make_row("fwd", 16, 16, "1x32768", "qla", 0.5)], timestamp="2026-12-08T00:00:00Z",
                      git_commit="abcdef0123456789")
    (d / "run6" / "dhws.ab.json").write_text(json.dumps(ab))
    ws = {**make_row("fwd", 16, 16, "1x32768", "qla", 0.4), "backend": "qla:bwd_dh=ws", "options": {"bwd_dh": "ws"}}
    variant = make_results([make_row("fwd", 16, 16, "1x32768", "qla", 1.2), ws],
                           timestamp="2026-12-09T00:00:00Z", git_commit="0123456789abcdef")
    (d / "variant.json").write_text(json.dumps(variant))
    cpu = make_results([make_row("fwd", 16, 16, "1x32768", "torch", 40.0)], gpu_name=None, device="cpu")
    (d / "cpu.json").write_text(json.dumps(cpu))
    r = CliRunner().invoke(main, ["history", str(d), "--cfg", "1x32768"])
    assert r.exit_code == 0, r.output
    assert "8 runs on NVIDIA H200" in r.output  # 7 runs + variant.json's default row
    assert "baselines/h200.json: a copy of" in r.output and "run6/results.json" in r.output
    assert "dhws.ab.json: an A/B variant file" in r.output and "no GPU (a CPU run)" in r.output
    assert "left out 1 rows of" in r.output and "qla:bwd_dh=ws" in r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("  2026-")]
    assert len(lines) == 8 and lines[-1].split()[1] == "0123456" and all(len(ln.split()[1]) <= 7 for ln in lines)
    r = CliRunner().invoke(main, ["history", str(d), "--cfg", "1x32768", "--variants"])
    assert r.exit_code == 0 and "9 runs on NVIDIA H200" in r.output and "ratio vs fla, qla:bwd_dh=ws" in r.output, r.output
