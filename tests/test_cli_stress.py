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
    assert lines[0] == "stress: 104 cases, phases fwd,bwd, backends qla,fla,flash_qla, arch sm90"
    assert len(lines) == 2 + 104
    padded = next(ln.split() for ln in lines if "pad1000" in ln)
    assert padded[:6] == ["fwd", "hk2_hv16", "256*1+64*63+64*65+pad1000", "384", "8448", "1000"]
    assert any(ln.split()[-2:] == ["bench", "beta=near0"] for ln in lines)
    assert any(ln.split()[2] == "1x262144" and ln.split()[-1] == "extreme" for ln in lines)
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
                       ("bench", "sigmoid", 100.0), ("qwen", "sigmoid", 100.0), ("bench", "sigmoid", 1.0)}
    assert len(rows) == 9 and {r["status"] for r in rows} == {"ok"}
    assert {(r["pattern"], tuple(r["seqlens"]), r["pad_tokens"]) for r in rows} == {("2*3+1+pad5", (3, 3, 1), 5)}
    assert data["run"]["gate_profile"] == "qwen,extreme,bench"
    # and its report: the Inputs column in the speed table, the accuracy section naming each recipe
    rep = _invoke("report", str(out))
    assert rep.exit_code == 0, rep.output
    head = next(ln for ln in rep.output.splitlines() if ln.startswith("Model Config"))
    assert "Inputs" in head.split()
    acc = rep.output.split(">>> ACCURACY", 1)[1]
    stats = next(ln.split() for ln in acc.splitlines() if ln.split()[:2] == ["torch", "o"])
    assert stats[2] == "9" and stats[-2:] == ["0", "0"]
    assert "Over tolerance or non-finite: 0 of 9 checked rows" in acc
