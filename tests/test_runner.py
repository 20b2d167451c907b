"""The sweep runner on the CPU: rows, error rows, incorrect rows, resume, interrupts."""

from __future__ import annotations

import math

import pytest
import torch

from qlabench import results as R
from qlabench import runner as RN
from qlabench import runsetup as RS
from qlabench.backends import Backend, get_backend
from qlabench.config import Case, Preset
from qlabench.kernels.reference import chunk_gated_delta_rule_ref
from qlabench.workload import parse_pattern

PRESET = Preset("hk1_hv2", 1, 2, "tiny")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _cases(phases=("fwd",), patterns=("1x24", "16+8")):
    return [Case(ph, PRESET, parse_pattern(p)) for ph in phases for p in patterns]


def _cfg(**kw):
    return RN.RunConfig(device="cpu", warmup=0, repeats=2, head_dim=16, **kw)


class Counting(Backend):
    """The float64 reference, recording the seqlens of each forward call; optionally broken/biased."""

    expects_cuda = False

    def __init__(self, name="counting", fail_on=None, bias=0.0, interrupt_on=None):
        self.name, self.fail_on, self.bias, self.interrupt_on = name, fail_on, bias, interrupt_on
        self.calls = 0
        self.seen = []

    def available(self, device):
        return True, ""

    def forward(self, w):
        self.calls += 1
        lens = tuple(w.seqlens)
        self.seen.append(lens)
        if self.interrupt_on == lens:
            raise KeyboardInterrupt
        if self.fail_on == lens:
            raise RuntimeError(f"kernel exploded at seqlens={lens}")
        o, ht = chunk_gated_delta_rule_ref(w.q, w.k, w.v, w.g, w.beta, scale=w.scale, initial_state=w.h0,
                                           output_final_state=True, cu_seqlens=w.cu_seqlens)
        return o * (1 + self.bias), ht


class Unavailable(Backend):
    name = "never"

    def available(self, device):
        return False, "not on this machine"


def _run(backends, cases, cfg=None, out=None, results=None):
    res = results or R.new_results({"gpu_name": None}, {"argv": []})
    return RN.Runner(cfg or _cfg(), backends, res, out, progress=False).run(cases)


def test_rows_have_values_and_schema(tmp_path):
    out = tmp_path / "r.json"
    res = _run([get_backend("torch"), Unavailable()], _cases(("fwd", "bwd")), out=out)
    assert len(res["rows"]) == 8
    loaded = R.load(out)
    ok = [r for r in loaded["rows"] if r["backend"] == "torch"]
    assert {r["status"] for r in ok} == {"ok"}
    for r in ok:
        assert r["median_ms"] > 0 and r["min_ms"] <= r["median_ms"] <= r["p80_ms"]
        assert r["samples"] == 2 and r["timer"] == "wall" and r["first_call_s"] > 0
        assert r["h_qk"] == 1 and r["h_v"] == 2 and r["total_tokens"] == 24
        assert max(r["errors"].values()) < 0.01
    bwd = next(r for r in ok if r["phase"] == "bwd")
    assert set(bwd["errors"]) == {"o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"}
    assert next(r for r in ok if r["pattern"] == "16+8")["seqlens"] == [16, 8]
    never = [r for r in loaded["rows"] if r["backend"] == "never"]
    assert {r["status"] for r in never} == {"unavailable"}
    assert never[0]["message"] == "not on this machine" and never[0]["median_ms"] is None


def test_failing_backend_gives_error_row_and_sweep_goes_on(tmp_path):
    bad = Counting("bad", fail_on=(16, 8))
    res = _run([bad, get_backend("torch")], _cases(patterns=("1x24", "16+8", "8x2")), out=tmp_path / "r.json")
    by = {(r["backend"], r["pattern"]): r for r in res["rows"]}
    assert len(by) == 6
    assert by["bad", "1x24"]["status"] == "ok"
    err = by["bad", "16+8"]
    assert err["status"] == "error" and "kernel exploded" in err["message"] and err["median_ms"] is None
    assert by["bad", "8x2"]["status"] == "ok" and by["torch", "16+8"]["status"] == "ok"


def test_incorrect_row_is_still_timed():
    res = _run([Counting("biased", bias=0.05)], _cases(patterns=("1x24",)))
    row = res["rows"][0]
    assert row["status"] == "incorrect" and row["median_ms"] > 0
    assert row["errors"]["o"] == pytest.approx(0.05, rel=1e-3) and "o: 0.05" in row["message"]


class Poisoned(Counting):
    """The reference with one NaN in o: the row is incorrect and counts the bad element."""

    def forward(self, w):
        o, ht = super().forward(w)
        o = o.clone()
        o[0, 0, 0, 0] = float("nan")
        return o, ht


def test_stress_case_rows_record_inputs_and_nonfinite_counts(tmp_path):
    case = Case("bwd", PRESET, parse_pattern("2*7+5+pad9"), "extreme", beta_profile="near1", h0_scale=100.0)
    out = tmp_path / "r.json"
    _run([get_backend("torch"), Poisoned("poisoned")], [case], out=out)
    good, bad = R.load(out)["rows"]
    for row in (good, bad):
        assert (row["pattern"], row["seqlens"], row["pad_tokens"]) == ("2*7+5+pad9", [7, 7, 5], 9)
        assert (row["gate_profile"], row["beta_profile"], row["h0_scale"]) == ("extreme", "near1", 100.0)
    assert good["status"] == "ok" and good["nonfinite"] == {} and set(good["errors"]) == {
        "o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"}
    assert max(good["errors"].values()) < 0.01  # dq, dk, dv come back in bf16
    assert bad["status"] == "incorrect" and bad["errors"]["o"] is None and bad["nonfinite"] == {"o": 1}
    assert "o: non-finite (1 NaN/Inf elements)" in bad["message"]


def test_end_of_run_table_reads_a_nonfinite_row_as_stored():
    """In memory a NaN output's error is NaN; the file holds null. The end-of-run table reads the stored
    view, so it is the full report table, not the fallback (the H200 stress run printed the fallback)."""
    res = _run([get_backend("torch"), Poisoned("poisoned")], _cases(patterns=("16+8",)))
    assert any(isinstance(e, float) and math.isnan(e) for r in res["rows"] for e in r["errors"].values())
    table = RS.format_tables(res)
    assert "report table unavailable" not in table and "poisoned" in table


def test_resume_skips_done_rows(tmp_path):
    out = tmp_path / "r.json"
    first = Counting("c", fail_on=(16, 8))
    _run([first], _cases(patterns=("1x24", "16+8")), out=out)
    assert [r["status"] for r in R.load(out)["rows"]] == ["ok", "error"]
    again = Counting("c")
    res = RS.open_results(out, {"gpu_name": None, "timestamp": "t1"}, {"argv": ["again"]}, resume=True)
    _run([again], _cases(patterns=("1x24", "16+8")), out=out, results=res)
    assert set(again.seen) == {(16, 8)}  # only the error case re-ran
    rows = R.load(out)["rows"]
    assert [r["status"] for r in rows] == ["ok", "ok"] and len(rows) == 2
    assert R.load(out)["run"]["resumed_argv"] == [["again"]]
    with pytest.raises(RS.RunSetupError, match="already exists"):
        RS.open_results(out, {"gpu_name": None, "timestamp": "t"}, {"argv": []}, resume=False)
    with pytest.raises(RS.RunSetupError, match="measured on the CPU"):
        RS.open_results(out, {"gpu_name": "NVIDIA H200", "timestamp": "t"}, {"argv": []}, resume=True)


def test_resume_at_another_commit_is_named_in_the_report(tmp_path):
    """A file resumed at another commit (or other library versions) holds rows of two trees: the env
    block records each resume's commit and versions, and the report's header names both."""
    from qlabench.report.tables import build_report, header_lines

    out = tmp_path / "r.json"
    env = {"gpu_name": None, "timestamp": "t0", "git_commit": "aaaaaaa", "git_dirty": False,
           "versions": {"torch": "2.11.0"}}
    _run([Counting("c", fail_on=(16, 8))], _cases(patterns=("1x24", "16+8")), out=out,
         results=RS.open_results(out, env, {"argv": ["first"]}, resume=False))
    env2 = {**env, "timestamp": "t1", "git_commit": "bbbbbbb", "versions": {"torch": "2.12.0"}}
    res = RS.open_results(out, env2, {"argv": ["again"]}, resume=True)
    _run([Counting("c")], _cases(patterns=("1x24", "16+8")), out=out, results=res)
    stored = R.load(out)
    assert stored["env"]["git_commit"] == "aaaaaaa"
    assert [(r["git_commit"], r["versions"]) for r in stored["env"]["resumes"]] == [("bbbbbbb", {"torch": "2.12.0"})]
    lines = "\n".join(header_lines(build_report([stored])))
    assert "Commit: aaaaaaa (resumed at bbbbbbb)" in lines
    assert "torch: 2.11.0 / 2.12.0" in lines


def test_resume_runs_only_missing_cases(tmp_path):
    out = tmp_path / "r.json"
    c1 = Counting("c")
    _run([c1], _cases(patterns=("1x24",)), out=out)
    c2 = Counting("c")
    res = RS.open_results(out, {"gpu_name": None, "timestamp": "t1"}, {"argv": []}, resume=True)
    _run([c2], _cases(patterns=("1x24", "1x40")), out=out, results=res)
    assert set(c2.seen) == {(40,)}
    assert [r["pattern"] for r in R.load(out)["rows"]] == ["1x24", "1x40"]


def test_interrupt_keeps_measured_rows(tmp_path):
    out = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt):
        _run([Counting("c", interrupt_on=(40,))], _cases(patterns=("1x24", "1x40", "1x56")), out=out)
    rows = R.load(out)["rows"]
    assert [(r["pattern"], r["status"]) for r in rows] == [("1x24", "ok")]


def test_reference_failure_gives_error_rows():
    class Broken(Counting):
        pass

    cases = [Case("fwd", Preset("hk1_hv2", 1, 2, "x"), parse_pattern("1x24"), gate_profile="bench")]
    cfg = _cfg()
    cfg.head_dim = 0  # make_workload rejects it: every runnable backend gets an error row
    res = _run([Broken("b")], cases, cfg=cfg)
    assert res["rows"][0]["status"] == "error" and "inputs/reference failed" in res["rows"][0]["message"]


def test_cpu_quick_scales_patterns():
    cfg = _cfg(quick=True, cpu_max_tokens=32)
    res = _run([get_backend("torch")], _cases(patterns=("28672+4096",)), cfg=cfg)
    row = res["rows"][0]
    assert row["total_tokens"] <= 32 and row["n_seqs"] == 2 and row["pattern"] == "28672+4096"
    assert "scaled to" in row["message"] and row["status"] == "ok"


def test_reference_outputs_are_float64():
    from qlabench.workload import make_workload

    w = make_workload(1, 2, (8, 8), seed=0, head_dim=8)
    ref = RN.reference_outputs("bwd", w)
    assert all(t.dtype == torch.float64 for t in ref.values())
    assert ref["dq"].shape == w.q.shape
