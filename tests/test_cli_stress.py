"""The stress sweep through the command line, on the CPU: its listing, and a shrunken run of it."""

from __future__ import annotations

import pytest
import torch

from qlabench import results as R

from .clitools import invoke as _invoke

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_list_cases_of_the_stress_sweep():
    res = _invoke("list", "cases", "--sweep", "stress")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "stress: 128 cases, phases fwd,bwd, backends qla,fla,flash_qla, arch sm90"
    assert len(lines) == 2 + 128
    padded = next(ln.split() for ln in lines if "pad1000" in ln)
    assert padded[:6] == ["fwd", "hk2_hv16", "256*1+64*63+64*65+pad1000", "384", "8448", "1000"]
    assert any(ln.split()[-2:] == ["bench", "beta=near0"] for ln in lines)
    assert any(ln.split()[2] == "1x262144" and ln.split()[-1] == "extreme" for ln in lines)
    few = [ln.split() for ln in lines if ln.endswith("qwen_strong_last")]
    assert len(few) == 24 and ["bwd", "hk1_hv1", "300+1+64+129+65+pad37", "5", "559", "37"] in [f[:6] for f in few]
    missing = _invoke("list", "cases")
    assert missing.exit_code == 2 and "list cases needs --sweep" in missing.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_run_stress_on_sm90_needs_the_gpu():
    res = _invoke("run", "--arch", "sm90", "--sweep", "stress")
    assert res.exit_code == 2 and "--arch sm90: no CUDA GPU is visible" in res.output


def test_shrunken_stress_run_on_cpu(tmp_path):
    # the sweep's input recipes on one tiny preset and one padded pattern: every recipe runs and is recorded
    out = tmp_path / "stress.json"
    res = _invoke("run", "--sweep", "stress", "--cfg", "hk1_hv2", "--phase", "fwd", "--seqlens", "2*3+1+pad5",
                  "--device", "cpu", "--quick", "--backends", "torch", "--out", str(out), "--no-progress")
    assert res.exit_code == 0, res.output
    data = R.load(out)
    rows = data["rows"]
    recipes = {(r["gate_profile"], r["beta_profile"], r["h0_scale"]) for r in rows}
    assert recipes == {("qwen", "sigmoid", 1.0), ("extreme", "sigmoid", 1.0), ("bench", "near0", 1.0),
                       ("bench", "near1", 1.0), ("qwen", "near0", 1.0), ("qwen", "near1", 1.0),
                       ("bench", "sigmoid", 100.0), ("qwen", "sigmoid", 100.0), ("bench", "sigmoid", 1.0),
                       ("qwen_strong_last", "sigmoid", 1.0)}
    assert len(rows) == 10 and {r["status"] for r in rows} == {"ok"}
    assert {(r["pattern"], tuple(r["seqlens"]), r["pad_tokens"]) for r in rows} == {("2*3+1+pad5", (3, 3, 1), 5)}
    assert data["run"]["gate_profile"] == "qwen,extreme,bench,qwen_strong_last"
    # and its report: the Inputs column in the speed table, the accuracy section naming each recipe
    rep = _invoke("report", str(out))
    assert rep.exit_code == 0, rep.output
    head = next(ln for ln in rep.output.splitlines() if ln.startswith("Model Config"))
    assert "Inputs" in head.split()
    acc = rep.output.split(">>> ACCURACY", 1)[1]
    stats = next(ln.split() for ln in acc.splitlines() if ln.split()[:2] == ["torch", "o"])
    assert stats[2] == "10" and stats[-2:] == ["0", "0"]
    assert "Over tolerance or non-finite: 0 of 10 checked rows" in acc


def test_gate_profile_option_takes_qwen_strong_last(tmp_path):
    # the stress sweep's few-head profile from the command line: the lone v-head of hk1_hv1 decays strongly
    out = tmp_path / "one.json"
    res = _invoke("run", "--cfg", "hk1_hv1", "--phase", "bwd", "--seqlens", "30+1+12+pad7", "--gate-profile",
                  "qwen_strong_last", "--device", "cpu", "--quick", "--backends", "torch", "--out", str(out),
                  "--no-progress")
    assert res.exit_code == 0, res.output
    [row] = R.load(out)["rows"]
    assert (row["gate_profile"], row["model"], row["status"], row["pad_tokens"]) == (
        "qwen_strong_last", "stress: one head", "ok", 7)
    bad = _invoke("run", "--cfg", "hk1_hv1", "--gate-profile", "qwen_strong", "--device", "cpu", "--quick")
    assert bad.exit_code == 2 and "qwen_strong_last" in bad.output


def test_resume_of_a_file_whose_sweep_gained_a_group(tmp_path):
    # `run --resume` compares measurement settings only (results.MEASUREMENT_SETTINGS), not the case
    # list: a results file of the stress sweep before its few-head group is continued, its rows kept
    # as they are and only the new cases run
    sweep, out = tmp_path / "stress.toml", tmp_path / "stress.json"
    sweep.write_text('phases = ["fwd", "bwd"]\nbackends = ["torch"]\nwarmup = 2\nrepeats = 10\n'
                     '[[groups]]\npresets = ["hk1_hv2"]\nseqlens = ["2*3+1+pad5"]\ngate_profile = ["qwen", "extreme"]\n')
    args = ("run", "--sweep", str(sweep), "--device", "cpu", "--quick", "--out", str(out), "--no-progress")
    assert (res := _invoke(*args)).exit_code == 0, res.output
    before = R.load(out)["rows"]
    assert len(before) == 4
    with sweep.open("a") as f:
        f.write('[[groups]]\npresets = ["hk1_hv1", "hk2_hv8"]\nseqlens = ["30+1+12+pad7"]\n'
                'gate_profile = "qwen_strong_last"\n')
    res = _invoke(*args, "--resume")
    assert res.exit_code == 0, res.output
    data = R.load(out)
    after = {R.row_key(r): r for r in data["rows"]}
    assert len(after) == 8 and {r["status"] for r in after.values()} == {"ok"}
    assert all(after[R.row_key(r)] == r for r in before)  # not measured again
    new = [r for r in data["rows"] if r["gate_profile"] == "qwen_strong_last"]
    assert sorted((r["phase"], r["preset"]) for r in new) == [
        ("bwd", "hk1_hv1"), ("bwd", "hk2_hv8"), ("fwd", "hk1_hv1"), ("fwd", "hk2_hv8")]
    # the run block's selection is widened by the resume (the report's Config line names every gate
    # profile of the rows), its measurement settings stay, the resume is appended
    assert data["run"]["n_cases"] == 8
    assert data["run"]["gate_profile"] == "qwen,extreme,qwen_strong_last"
    assert data["run"]["presets"] == ["hk1_hv2", "hk1_hv1", "hk2_hv8"]
    assert data["run"]["phases"] == ["fwd", "bwd"] and data["run"]["backends"] == ["torch"]
    assert len(data["run"]["resumed_argv"]) == 1
