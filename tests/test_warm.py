"""`qlabench warm` (qlabench/warm.py): the plan, the process pool on the CPU backend, and the CLI."""

from __future__ import annotations

import json
import os
import time

import pytest

from qlabench import results as R
from qlabench import runsetup as RS
from qlabench import warm as W
from qlabench.backends import Backend, get_backend, register, unregister
from qlabench.config import Case, Preset
from qlabench.kernels.reference import chunk_gated_delta_rule_ref
from qlabench.workload import parse_pattern

from .clitools import invoke as _invoke

PRESETS = (Preset("hk1_hv2", 1, 2, "tiny"), Preset("hk2_hv2", 2, 2, "tiny"))
# tiny patterns and presets: a task is the process start plus a few milliseconds of float64 work
CLI_CASES = ("--cfg", "hk1_hv2,hk2_hv4", "--seqlens", "1x24,16+8", "--phase", "fwd,bwd")
CPU = {"device": "cpu", "threads": 1}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class Scripted(Backend):
    """The float64 reference, misbehaving for chosen h_v (pickled into the task processes)."""

    expects_cuda = False

    def __init__(self, name="scripted", fail_hv=(), crash_hv=(), sleep_hv=(), refuse_env=None):
        self.name, self.fail_hv, self.crash_hv, self.sleep_hv = name, fail_hv, crash_hv, sleep_hv
        self.refuse_env = refuse_env

    def available(self, device):
        return True, ""

    def forward(self, w):
        h_v = w.v.shape[2]
        if self.refuse_env and os.environ.get(self.refuse_env):
            raise RuntimeError(f"{self.refuse_env} is set in the task process")
        if h_v in self.crash_hv:
            os._exit(3)  # the task process dies (as on a segfault or an OOM kill)
        if h_v in self.fail_hv:
            raise RuntimeError(f"kernel exploded at h_v={h_v}")
        if h_v in self.sleep_hv:
            time.sleep(120)
        return chunk_gated_delta_rule_ref(w.q, w.k, w.v, w.g, w.beta, scale=w.scale, initial_state=w.h0,
                                          output_final_state=True, cu_seqlens=w.cu_seqlens)


def _cases(presets=PRESETS, phases=("fwd", "bwd"), patterns=("1x24", "16+8")):
    return [Case(ph, p, parse_pattern(s)) for p in presets for ph in phases for s in patterns]


# --- planning --------------------------------------------------------------------------------------


def test_plan_one_task_per_preset_phase_backend():
    bes = [get_backend("torch"), Scripted()]
    tasks = W.plan_tasks(_cases(), bes)
    assert [(t.preset.name, t.phase, t.backend.name) for t in tasks] == [
        (p, ph, b) for p in ("hk1_hv2", "hk2_hv2") for ph in ("fwd", "bwd") for b in ("torch", "scripted")]
    assert {t.pattern.name for t in tasks} == {"1x24"}  # the first pattern of each preset and phase
    small = W.plan_tasks(_cases(patterns=("1x24", "16+8", "1x8")), bes, "smallest")
    assert {t.pattern.name for t in small} == {"1x8"}
    fixed = W.plan_tasks(_cases(), bes, parse_pattern("2048+2048"))
    assert {t.pattern.seqlens for t in fixed} == {(2048, 2048)}
    with pytest.raises(ValueError, match="'largest'"):
        W.plan_tasks(_cases(), bes, "largest")


def test_resolve_pattern_and_default_jobs():
    assert W.resolve_pattern(None) == "first" and W.resolve_pattern("smallest") == "smallest"
    assert W.resolve_pattern("2048+2048").seqlens == (2048, 2048)
    with pytest.raises(ValueError, match="'12y'"):
        W.resolve_pattern("12y")
    assert W.default_jobs(18, cpu_count=16) == 8
    assert W.default_jobs(3, cpu_count=16) == 3
    assert W.default_jobs(5, cpu_count=1) == 1


def test_selection_is_the_runs_for_a_sweep():
    sel = RS.select_cases(sweep="ci-smoke")
    tasks = W.plan_tasks(sel.cases, [get_backend("torch")])
    from qlabench.config import load_sweep

    sw = load_sweep("ci-smoke")
    want = list(dict.fromkeys((c.preset.name, c.phase) for c in sw.cases))
    assert [(t.preset.name, t.phase) for t in tasks] == want
    for t in tasks:
        first = next(c for c in sw.cases if (c.preset.name, c.phase) == (t.preset.name, t.phase))
        assert t.pattern == first.pattern and t.gate_profile == first.gate_profile
    # --cfg and --phase override the sweep's, as for `qlabench run`
    sel = RS.select_cases(sweep="ci-smoke", cfgs=("hk4_hv8",), phase="fwd")
    assert [(c.preset.name, c.phase) for c in sel.cases] == [("hk4_hv8", "fwd")] * 3


# --- one task, in this process ---------------------------------------------------------------------


def test_run_task_in_process():
    task = W.WarmTask(PRESETS[0], "bwd", get_backend("torch"), parse_pattern("16+8"))
    res = W.run_task(task, W.WarmOptions(**CPU))
    assert res["status"] == "ok" and res["first_call_s"] > 0
    bad = W.WarmTask(Preset("hk3_hv4", 3, 4, "bad"), "fwd", get_backend("torch"), parse_pattern("1x24"))
    res = W.run_task(bad, W.WarmOptions(**CPU))
    assert res["status"] == "error" and "h_v must be a multiple of h_qk" in res["message"]
    res = W.run_task(W.WarmTask(PRESETS[0], "fwd", get_backend("fla"), parse_pattern("1x24")), W.WarmOptions(**CPU))
    assert res["status"] == "unavailable" and "CUDA" in res["message"]


# --- the pool --------------------------------------------------------------------------------------


def test_pool_runs_tasks_over_presets():
    tasks = W.plan_tasks(_cases(), [get_backend("torch")])
    seen = []
    rows = W.warm(tasks, W.WarmOptions(**CPU), jobs=2, timeout_s=120,
                  on_done=lambda row, n, total: seen.append((n, total)))
    assert [(r["preset"], r["phase"], r["backend"]) for r in rows] == [
        ("hk1_hv2", "fwd", "torch"), ("hk1_hv2", "bwd", "torch"), ("hk2_hv2", "fwd", "torch"),
        ("hk2_hv2", "bwd", "torch")]
    assert all(r["status"] == "ok" and r["message"] == "" for r in rows), rows
    assert all(0 < r["first_call_s"] <= r["wall_s"] for r in rows)
    assert sorted(seen) == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_failing_tasks_become_error_rows_and_the_rest_finish():
    bad_preset = Preset("hk3_hv4", 3, 4, "bad")  # make_workload refuses it in the task process
    presets = (*PRESETS, Preset("hk1_hv4", 1, 4, "t"), Preset("hk1_hv8", 1, 8, "t"), bad_preset)
    tasks = W.plan_tasks(_cases(presets, phases=("fwd",)), [Scripted(fail_hv=(2,), crash_hv=(8,))])
    t0 = time.monotonic()
    rows = W.warm(tasks, W.WarmOptions(**CPU), jobs=3, timeout_s=120)
    by = {r["preset"]: r for r in rows}
    assert [r["preset"] for r in rows] == [p.name for p in presets]
    assert by["hk1_hv2"]["status"] == by["hk2_hv2"]["status"] == "error"
    assert "kernel exploded at h_v=2" in by["hk1_hv2"]["message"]
    assert by["hk1_hv4"]["status"] == "ok" and by["hk1_hv4"]["first_call_s"] > 0
    assert by["hk1_hv8"]["status"] == "error" and "died without a result (exit code 3)" in by["hk1_hv8"]["message"]
    assert by["hk3_hv4"]["status"] == "error" and "'hk3_hv4'" not in by["hk3_hv4"]["message"]
    assert "h_v must be a multiple of h_qk" in by["hk3_hv4"]["message"]
    assert time.monotonic() - t0 < 100


def test_timeout_kills_the_task_and_the_others_finish():
    presets = (Preset("hk1_hv2", 1, 2, "t"), Preset("hk1_hv4", 1, 4, "slow"), Preset("hk2_hv2", 2, 2, "t"))
    tasks = W.plan_tasks(_cases(presets, phases=("fwd",)), [Scripted(sleep_hv=(4,))])
    t0 = time.monotonic()
    rows = W.warm(tasks, W.WarmOptions(**CPU), jobs=3, timeout_s=15)
    elapsed = time.monotonic() - t0
    assert [r["status"] for r in rows] == ["ok", "error", "ok"], rows
    assert "timed out after 15 s" in rows[1]["message"] and rows[1]["wall_s"] >= 15
    assert elapsed < 60  # not the 120 s the slow task sleeps


def test_tasks_run_without_the_autotune_cache_switch(monkeypatch):
    monkeypatch.setenv(W.AUTOTUNE_CACHE_VAR, "1")
    tasks = W.plan_tasks(_cases(PRESETS[:1], phases=("fwd",)), [Scripted(refuse_env=W.AUTOTUNE_CACHE_VAR)])
    rows = W.warm(tasks, W.WarmOptions(**CPU), jobs=1, timeout_s=120)
    assert rows[0]["status"] == "ok", rows[0]["message"]


def test_pool_rejects_bad_settings():
    with pytest.raises(ValueError, match="jobs must be >= 1, got 0"):
        W.WarmPool([], W.WarmOptions(**CPU), jobs=0)
    with pytest.raises(ValueError, match="timeout_s must be > 0, got -1"):
        W.WarmPool([], W.WarmOptions(**CPU), jobs=1, timeout_s=-1)
    with pytest.raises(ValueError, match="'tpu'"):
        W.WarmOptions(device="tpu")


# --- the CLI ---------------------------------------------------------------------------------------


def test_cli_prints_the_table_and_matches_runs_selection(tmp_path):
    run_out, out = tmp_path / "run.json", tmp_path / "warm.json"
    res = _invoke("warm", *CLI_CASES, "--device", "cpu", "--backends", "torch", "--jobs", "2", "--out", str(out))
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("preset"))
    assert lines[head].split()[:4] == ["preset", "phase", "backend", "pattern"]
    table = [ln.split() for ln in lines[head + 1: head + 5]]
    assert [(t[0], t[1], t[2], t[3]) for t in table] == [
        ("hk1_hv2", "fwd", "torch", "1x24"), ("hk1_hv2", "bwd", "torch", "1x24"),
        ("hk2_hv4", "fwd", "torch", "1x24"), ("hk2_hv4", "bwd", "torch", "1x24")]
    assert all(t[6] == "ok" for t in table)
    assert "4/4 tasks: 4 ok" in res.output
    data = json.loads(out.read_text())
    assert data["schema"] == "qlabench.warm/1" and data["device"] == "cpu" and data["jobs"] == 2
    assert len(data["tasks"]) == 4 and {r["status"] for r in data["tasks"]} == {"ok"}
    assert set(data["caches"]) == {"triton", "tilelang"}
    # the same options select the same presets and phases in `qlabench run`; each task runs the first
    # pattern the run times for its preset and phase
    res = _invoke("run", *CLI_CASES, "--quick", "--device", "cpu", "--out", str(run_out), "--no-progress")
    assert res.exit_code == 0, res.output
    firsts = {}
    for r in R.load(run_out)["rows"]:
        firsts.setdefault((r["preset"], r["phase"]), r["pattern"])
    assert [(t["preset"], t["phase"]) for t in data["tasks"]] == list(firsts)
    assert {(t["preset"], t["phase"]): t["pattern"] for t in data["tasks"]} == firsts


def test_cli_dry_run_lists_the_sweeps_tasks():
    res = _invoke("warm", "--sweep", "h200-bwd", "--device", "cpu", "--backends", "fla,flash_qla", "--dry-run")
    assert res.exit_code == 0, res.output
    listed = [ln.split()[:4] for ln in res.output.splitlines() if ln.startswith("hk")]
    assert len(listed) == 20  # 5 presets x (bwd, fwdbwd) x 2 backends
    assert {ln[3] for ln in listed} == {"8k_1seq"} and {ln[1] for ln in listed} == {"bwd", "fwdbwd"}
    assert "20 tasks (5 presets x 2 phases x 2 backends" in res.output


class FailsOnHv2(Scripted):
    """A registered backend (the CLI looks backends up by name) that raises on h_v = 2."""

    def __init__(self):
        super().__init__(name="fails_hv2", fail_hv=(2,))


@pytest.fixture
def failing_backend():
    register("fails_hv2")(FailsOnHv2)
    yield "fails_hv2"
    unregister("fails_hv2")


def test_cli_failing_task_exits_1_with_the_others_ok(failing_backend):
    res = _invoke("warm", "--cfg", "hk1_hv2,hk1_hv4", "--seqlens", "1x24", "--device", "cpu", "--backends",
                  f"torch,{failing_backend}", "--jobs", "2")
    assert res.exit_code == 1, res.output
    rows = [ln.split() for ln in res.output.splitlines() if ln.startswith("hk1_")]
    status = {(r[0], r[2]): r[6] for r in rows}
    assert status == {("hk1_hv2", "torch"): "ok", ("hk1_hv2", "fails_hv2"): "error",
                      ("hk1_hv4", "torch"): "ok", ("hk1_hv4", "fails_hv2"): "ok"}
    assert "kernel exploded at h_v=2" in res.output and "4/4 tasks: 3 ok, 1 error" in res.output


def test_cli_unavailable_backend_is_not_a_failure():
    # fla cannot run on the CPU: an `unavailable` row, reported, exit code 0
    res = _invoke("warm", "--cfg", "hk1_hv2", "--seqlens", "1x24", "--device", "cpu", "--backends", "torch,fla")
    assert res.exit_code == 0, res.output
    assert "unavailable" in res.output and "2/2 tasks: 1 ok, 1 unavailable" in res.output


@pytest.mark.parametrize("args,needle", [
    (["--cfg", "hk3_hv8"], "hk3_hv8"),
    (["--cfg", "hk2_hv4", "--seqlens", "1x4096,12y"], "'12y'"),
    (["--cfg", "hk2_hv4", "--phase", "sideways"], "sideways"),
    (["--cfg", "hk2_hv4", "--backends", "torch,warp"], "'warp'"),
    (["--cfg", "hk2_hv4", "--pattern", "huge"], "'huge'"),
    (["--sweep", "nope"], "unknown sweep 'nope'"),
    ([], "--cfg"),
])
def test_bad_options_exit_2_with_message(args, needle):
    res = _invoke("warm", "--device", "cpu", "--backends", "torch", *args) if "--backends" not in args else \
        _invoke("warm", "--device", "cpu", *args)
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output
