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
from qlabench.backends import Backend
from qlabench.cli import main
from qlabench.kernels.reference import chunk_gated_delta_rule_ref
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
    # a missing folder is created (as run --out does); a path through a file is a one-line error
    res = _invoke("report", base, "--out", tmp_path / "nodir" / "r.md")
    assert res.exit_code == 0 and (tmp_path / "nodir" / "r.md").read_text().strip(), res.output
    res = _invoke("report", base, "--out", base.parent / base.name / "r.md")
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
    assert written == ["a/b/evil.json", "a/b/plots/accuracy_fwd.png",
                       "a/b/plots/heatmap_fwd_vs_x__________escaped.png", "a/b/plots/latency_fwd.png",
                       "a/b/plots/speedup_fwd.png"]


def test_history_plot_refuses_to_overwrite_a_results_file(tmp_path):
    d = tmp_path / "hist"
    d.mkdir()
    run = _write(d / "run.json", make_results(_rows()))
    before = run.read_bytes()
    _one_line_error(_invoke("history", d, "--plot", run), 2, "refusing to overwrite", str(run))
    assert run.read_bytes() == before


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


# ---- run: results that cannot be lost ---------------------------------------------------------------

TINY = ("--cfg", "hk1_hv2", "--seqlens", "1x24", "--quick", "--device", "cpu", "--no-progress")


@pytest.fixture
def one_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def no_case_may_run(monkeypatch):
    """Fails the test if a case starts: the error must come before anything is measured."""
    from qlabench import runner as RN

    def run_case(self, case):
        raise AssertionError(f"a case ran: {case.label}")

    monkeypatch.setattr(RN.Runner, "run_case", run_case)


def test_a_second_run_on_the_same_out_is_refused(tmp_path, no_case_may_run):
    out = tmp_path / "r.json"
    lock = R.OutputLock(out).acquire()  # the first run, still measuring
    try:
        for extra in ((), ("--resume",), ("--workers", "1")):
            _one_line_error(_invoke("run", *TINY, "--out", out, *extra), 2,
                            f"{out} is being written by another qlabench run", "lock")
        assert not out.exists()
    finally:
        lock.release()
    assert not (tmp_path / "r.json.lock").exists()


def test_the_lock_is_held_for_the_run_and_released(tmp_path, monkeypatch, one_thread):
    from qlabench import runner as RN

    out = tmp_path / "r.json"
    seen = []
    run_case = RN.Runner.run_case

    def spy(self, case):
        seen.append((tmp_path / "r.json.lock").exists())
        with pytest.raises(R.ResultsError, match="being written by another qlabench run"):
            R.OutputLock(out).acquire()
        run_case(self, case)

    monkeypatch.setattr(RN.Runner, "run_case", spy)
    res = _invoke("run", *TINY, "--out", out)
    assert res.exit_code == 0, res.output
    assert seen == [True] and not (tmp_path / "r.json.lock").exists()
    assert [r["status"] for r in R.load(out)["rows"]] == ["ok"]


@pytest.mark.parametrize("where", ["file_as_folder", "dev_null"])
def test_unwritable_out_fails_before_any_case(tmp_path, where, no_case_may_run):
    if where == "file_as_folder":
        (tmp_path / "plain").write_text("x")
        out = tmp_path / "plain" / "r.json"
    else:
        out = "/dev/null/r.json"
    _one_line_error(_invoke("run", *TINY, "--out", out), 2, f"--out {out}", "cannot")
    res = _invoke("run", *TINY, "--out", tmp_path)  # click's own check of the option: a usage error
    assert res.exit_code == 2 and "is a directory" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-0.1", "1", "1.5", "-inf"])
def test_tolerance_must_be_finite_in_0_1(tmp_path, value, no_case_may_run):
    _one_line_error(_invoke("run", *TINY, "--out", tmp_path / "r.json", "--tolerance", value), 2,
                    "--tolerance must be a finite number in (0, 1)")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("extra, needle", [
    (("--seed", "1"), "seed (file: 0, this run: 1)"),
    (("--no-h0",), "with_h0 (file: True, this run: False)"),
    (("--tolerance", "0.05"), "tolerance (file: 0.02, this run: 0.05)"),
    (("--repeats", "7"), "repeats (file: 5, this run: 7)"),
    (("--warmup", "2"), "warmup (file: 1, this run: 2)"),
])
def test_resume_refuses_other_measurement_settings(tmp_path, extra, needle, one_thread):
    out = tmp_path / "r.json"
    assert _invoke("run", *TINY, "--out", out).exit_code == 0
    before = out.read_bytes()
    _one_line_error(_invoke("run", *TINY, "--out", out, "--resume", *extra), 2,
                    f"--resume: {out} was measured under other settings", needle)
    assert out.read_bytes() == before
    again = _invoke("run", *TINY, "--out", out, "--resume")  # the same settings: fine
    assert again.exit_code == 0, again.output


def test_resume_of_a_file_that_does_not_record_a_setting(tmp_path, no_case_may_run):
    out = tmp_path / "r.json"
    doc = make_results(_rows(), gpu_name=None, device="cpu")
    del doc["run"]["seed"]
    _write(out, doc)
    _one_line_error(_invoke("run", *TINY, "--out", out, "--resume"), 2, "seed (file: not recorded, this run: 0)")


def test_resume_of_an_empty_file_runs(tmp_path, one_thread):
    out = tmp_path / "r.json"
    with pytest.MonkeyPatch.context() as mp:  # a run stopped before its first row: the file has no rows
        from qlabench import runner as RN

        mp.setattr(RN.Runner, "run_case", lambda self, case: (_ for _ in ()).throw(KeyboardInterrupt))
        res = _invoke("run", *TINY, "--out", out)
    assert res.exit_code == 130 and R.load(out)["rows"] == []
    _one_line_error(_invoke("report", out), 2, "no rows")
    res = _invoke("run", *TINY, "--out", out, "--resume")
    assert res.exit_code == 0, res.output
    assert [r["status"] for r in R.load(out)["rows"]] == ["ok"]


# ---- patterns: bounded, and cut in O(n) -----------------------------------------------------------


@pytest.mark.parametrize("pattern", ["2000000k_2seq", "1000000x1000000", "99999999999", "100000*1000",
                                     "1x32768+pad99999999", "16777216+1", "16384k_70000seq"])
def test_absurd_patterns_are_rejected_before_allocating(tmp_path, pattern, no_case_may_run):
    t0 = time.monotonic()
    _one_line_error(_invoke("run", "--cfg", "hk1_hv2", "--seqlens", pattern, "--quick", "--device", "cpu",
                            "--out", tmp_path / "r.json"), 2, f"seqlen pattern {pattern!r}",
                    "beyond the bound of 16777216 tokens and 65536 sequences")
    assert time.monotonic() - t0 < 5


def test_random_cut_is_linear_and_keeps_the_points():
    import itertools

    import torch

    from qlabench.workload import parse_pattern, random_cut

    def randperm_cut(total, n, seed):  # how the cut was drawn before: a permutation of every token
        gen = torch.Generator().manual_seed(seed)
        cuts = sorted((torch.randperm(total - 1, generator=gen)[: n - 1] + 1).tolist())
        return tuple(b - a for a, b in itertools.pairwise([0, *cuts, total]))

    for total, n, seed in [(32768, 4, 42), (8192, 2, 42), (2, 2, 0), (5, 5, 3), (1000, 999, 7),
                           (300_000, 100, 2**40 + 1)]:
        assert random_cut(total, n, seed) == randperm_cut(total, n, seed), (total, n, seed)
    t0 = time.monotonic()
    big = parse_pattern("16384k_4seq")  # the largest total: 16M tokens, no 128 MB permutation
    assert sum(big.seqlens) == 2**24 and len(big.seqlens) == 4
    assert time.monotonic() - t0 < 0.5


# ---- a per-case timeout -----------------------------------------------------------------------------


class Sleepy(Backend):
    """The float64 reference, stuck for a minute on the 24-token case (pickled into the worker)."""

    name = "sleepy"
    expects_cuda = False

    def available(self, device):
        return True, ""

    def forward(self, w):
        if tuple(w.seqlens) == (24,):
            time.sleep(60)
        return chunk_gated_delta_rule_ref(w.q, w.k, w.v, w.g, w.beta, scale=w.scale, initial_state=w.h0,
                                          output_final_state=True, cu_seqlens=w.cu_seqlens)


def test_case_timeout_records_timeout_rows_and_goes_on(tmp_path, monkeypatch, one_thread):
    from qlabench import backends

    monkeypatch.setitem(backends._REGISTRY, "sleepy", Sleepy)
    out = tmp_path / "r.json"
    t0 = time.monotonic()
    res = _invoke("run", "--cfg", "hk1_hv2", "--seqlens", "1x24,1x16", "--quick", "--device", "cpu", "--no-progress",
                  "--backends", "sleepy,torch", "--case-timeout", "3", "--out", out)
    assert res.exit_code == 0, res.output
    assert time.monotonic() - t0 < 50
    assert "exceeded --case-timeout 3 s" in res.output
    data = R.load(out)
    status = {(r["pattern"], r["backend"]): r["status"] for r in data["rows"]}
    assert status == {("1x24", "sleepy"): "timeout", ("1x24", "torch"): "timeout",
                      ("1x16", "sleepy"): "ok", ("1x16", "torch"): "ok"}
    timed_out = next(r for r in data["rows"] if r["status"] == "timeout")
    assert "case exceeded --case-timeout 3 s" in timed_out["message"] and timed_out["median_ms"] is None
    assert data["run"]["case_timeout_s"] == 3.0
    # a timeout row of the gated backend fails the gate
    gate = _invoke("gate", out, "--min-speedup", "sleepy/torch=0.5", "--backend", "sleepy")
    assert gate.exit_code == 1 and "status timeout" in gate.output


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_case_timeout_must_be_positive_and_finite(tmp_path, value, no_case_may_run):
    _one_line_error(_invoke("run", *TINY, "--out", tmp_path / "r.json", "--case-timeout", value), 2,
                    "--case-timeout must be a finite number of seconds > 0")


# ---- sweep files: every key is read or refused ------------------------------------------------------

SWEEP = 'presets = ["hk1_hv2"]\nseqlens = ["1x24"]\nbackends = ["torch"]\n'


def test_sweep_dtype_is_run_and_recorded(tmp_path, one_thread):
    sweep = tmp_path / "half.toml"
    sweep.write_text(SWEEP + 'dtype = "float16"\narch = "sm90"\n')
    out = tmp_path / "r.json"
    res = _invoke("run", "--sweep", sweep, "--quick", "--device", "cpu", "--no-progress", "--out", out)
    assert res.exit_code == 0, res.output
    data = R.load(out)
    assert [(r["dtype"], r["status"]) for r in data["rows"]] == [("float16", "ok")]
    assert data["run"]["arch"] == "sm90"
    from qlabench.runsetup import select_cases

    sel = select_cases(str(sweep), phase="fwd,bwd")  # cases the command line adds keep the sweep's dtype
    assert {c.dtype for c in sel.cases} == {"float16"} and {c.phase for c in sel.cases} == {"fwd", "bwd"}


@pytest.mark.parametrize("extra, needle", [
    ('dtype = "float64"\n', "dtype must be one of bfloat16, float16, got 'float64'"),
    ('dtype = 16\n', "dtype must be one of bfloat16, float16, got 16"),
    ('arch = "sm89"\n', "arch must be one of sm90, sm100, sm120, got 'sm89'"),
    ('warmpu = 3\n', "unknown keys ['warmpu']"),
])
def test_bad_or_unknown_sweep_keys_exit_2(tmp_path, extra, needle, no_case_may_run):
    sweep = tmp_path / "bad.toml"
    sweep.write_text(SWEEP + extra)
    _one_line_error(_invoke("run", "--sweep", sweep, "--quick", "--device", "cpu", "--out", tmp_path / "r.json"),
                    2, str(sweep), needle)


# ---- env.git_commit: only qlabench's own repository ---------------------------------------------------


def _git(cwd, *args):
    import subprocess

    return subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


def test_git_commit_only_from_qlabenchs_own_repository(tmp_path, monkeypatch):
    import qlabench

    monkeypatch.delenv("QLABENCH_GIT_COMMIT", raising=False)
    outer = tmp_path / "outer"
    copy = outer / "vendor" / "qlabench-copy"
    (copy / "qlabench").mkdir(parents=True)
    (copy / "qlabench" / "__init__.py").write_text("")
    (copy / "pyproject.toml").write_text('[project]\nname = "qlabench"\n')
    _git(outer, "init", "-q")
    _git(outer, "add", "-A")
    _git(outer, "commit", "-q", "-m", "outer")
    monkeypatch.setattr(qlabench, "__file__", str(copy / "qlabench" / "__init__.py"))

    def env():
        res = _invoke("env", "--json")
        assert res.exit_code == 0, res.output
        return json.loads(res.output)

    assert env()["git_commit"] is None  # the enclosing checkout's commit is not ours
    (copy / "pyproject.toml").write_text('[project]\nname = "something-else"\n')
    _git(copy, "init", "-q")
    _git(copy, "add", "-A")
    _git(copy, "commit", "-q", "-m", "inner")
    assert env()["git_commit"] is None  # its own repository, but not qlabench's project
    (copy / "pyproject.toml").write_text('[project]\nname = "qlabench"\n')
    _git(copy, "commit", "-q", "-am", "qlabench")
    assert env()["git_commit"] == _git(copy, "rev-parse", "HEAD")
    monkeypatch.setenv("QLABENCH_GIT_COMMIT", "feedbeef")
    assert env()["git_commit"] == "feedbeef"


# ---- qlabench baseline update --------------------------------------------------------------------------


def _run_doc(qla_status="ok", gpu="NVIDIA H200"):
    rows = _rows(backends=("qla", "fla")) + [make_row("fwd", 16, 16, p, "flash_qla", 0.5) for p in PATTERNS[:3]]
    rows.append(make_row("fwd", 16, 16, PATTERNS[3], "flash_qla", None, status="error"))
    rows[0] = make_row("fwd", 16, 16, PATTERNS[0], "qla", 1.0, status=qla_status)
    return make_results(rows, gpu_name=gpu)


def test_baseline_update_keeps_ok_rows_of_the_chosen_backends(tmp_path, monkeypatch):
    run = _write(tmp_path / "run.json", _run_doc())
    monkeypatch.chdir(tmp_path)
    res = _invoke("baseline", "update", run, "--gpu", "h200", "--backends", "qla,flash_qla")
    assert res.exit_code == 0, res.output
    out = tmp_path / "results" / "baselines" / "h200.json"
    assert res.output.strip() == f"wrote results/baselines/h200.json: 13 ok rows (qla 10, flash_qla 3) from {run}"
    doc = R.load(out)
    assert {(r["backend"], r["status"]) for r in doc["rows"]} == {("qla", "ok"), ("flash_qla", "ok")}
    assert doc["run"]["baseline"]["backends"] == ["qla", "flash_qla"] and doc["env"]["gpu_name"] == "NVIDIA H200"
    assert sorted(p.name for p in out.parent.iterdir()) == ["h200.json"]  # atomic: no temp file left
    gate = _invoke("gate", run, "--baseline", out)
    assert gate.exit_code == 0, gate.output
    # every backend by default
    res = _invoke("baseline", "update", run, "--gpu", "h200", "--out", tmp_path / "all.json")
    assert res.exit_code == 0 and "23 ok rows (qla 10, fla 10, flash_qla 3)" in res.output


@pytest.mark.parametrize("status", ["incorrect", "error", "timeout"])
def test_baseline_update_refuses_a_run_whose_qla_rows_are_not_all_ok(tmp_path, status):
    run = _write(tmp_path / "run.json", _run_doc(qla_status=status))
    out = tmp_path / "h200.json"
    _one_line_error(_invoke("baseline", "update", run, "--gpu", "h200", "--out", out), 2,
                    f"refusing {run}: 1 of its 10 qla rows are not ok", f"1x2048 [bench] qla: {status}")
    assert not out.exists()


def test_baseline_update_bad_inputs(tmp_path):
    run = _write(tmp_path / "run.json", _run_doc())
    out = tmp_path / "b.json"
    _one_line_error(_invoke("baseline", "update", run, "--gpu", "h100", "--out", out), 2,
                    "was measured on NVIDIA H200 (h200), not h100")
    _one_line_error(_invoke("baseline", "update", run, "--gpu", "../../x"), 2, "--gpu must be a GPU slug")
    _one_line_error(_invoke("baseline", "update", run, "--gpu", "h200", "--backends", "qla,nope", "--out", out),
                    2, "backend 'nope' is not in")
    _one_line_error(_invoke("baseline", "update", run, "--gpu", "h200", "--out", run), 2, "refusing to overwrite")
    no_qla = _write(tmp_path / "fla.json", make_results(_rows(backends=("fla",))))
    _one_line_error(_invoke("baseline", "update", no_qla, "--gpu", "h200", "--out", out), 2, "has no qla rows")
    bad = make_results(_rows())
    bad["rows"][2]["median_ms"] = math.inf
    bad_path = _write(tmp_path / "bad.json", bad, allow_nan=True)
    _one_line_error(_invoke("baseline", "update", bad_path, "--gpu", "h200", "--out", out), 2,
                    "rows[2].median_ms = inf")
    empty = _write(tmp_path / "empty.json", make_results([]))
    _one_line_error(_invoke("baseline", "update", empty, "--gpu", "h200", "--out", out), 2, "no rows")
    assert not out.exists()


def test_one_definition_of_a_results_file():
    import qlabench.gate as G
    import qlabench.history as H
    import qlabench.report as REP
    import qlabench.report.frame as F

    assert F.ResultsError is R.ResultsError and REP.ResultsError is R.ResultsError
    assert F.SCHEMA is R.SCHEMA and F.TIME_FIELDS is R.TIME_FIELDS and F.CASE_KEY == R.CASE_FIELDS
    assert G.MATCH_KEY == R.KEY_FIELDS and H.R is R
    row = make_row("fwd", 16, 16, "1x4096", "qla", 1.0)
    assert R.row_key(row) == ("fwd", 16, 16, "1x4096", "bench", "bfloat16", "sigmoid", 1.0, "qla")
    old = {k: v for k, v in row.items() if k not in ("beta_profile", "h0_scale")}  # a file from before them
    assert R.row_key(old) == R.row_key(row)
