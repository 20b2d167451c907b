"""Sharded sweeps (qlabench/shard.py): --gpus parsing, the plan, and worker pools on the CPU backend."""

from __future__ import annotations

import os
import time

import pytest
import torch

from qlabench import results as R
from qlabench import shard as SH
from qlabench.backends import Backend
from qlabench.config import Case, Preset, load_sweep
from qlabench.kernels.reference import chunk_gated_delta_rule_ref
from qlabench.runner import RunConfig
from qlabench.workload import parse_pattern

from .clitools import invoke as _invoke

# equal h_v: the two presets cost the same, so each stays whole on one of two workers
PRESETS = (Preset("hk1_hv2", 1, 2, "tiny"), Preset("hk2_hv2", 2, 2, "tiny"))
# tiny patterns: a --quick CPU run keeps them as written
CLI_CASES = ("--cfg", "hk1_hv4,hk2_hv4", "--seqlens", "1x24,16+8", "--phase", "fwd,bwd")


# one torch thread (tests/conftest.py): also what each CPU worker gets (parent threads // workers, at least 1)
pytestmark = pytest.mark.usefixtures("one_thread")


def _cli_run(out, *extra):
    res = _invoke("run", *CLI_CASES, "--quick", "--device", "cpu", "--out", str(out), "--no-progress", *extra)
    assert res.exit_code == 0, res.output
    return R.load(out)


class Scripted(Backend):
    """The float64 reference, with per-case misbehaviour chosen by seqlens; pickled into the workers."""

    expects_cuda = False

    def __init__(self, name="scripted", fail_on=(), crash_on=(), sleep_on=()):
        self.name, self.fail_on, self.crash_on, self.sleep_on = name, fail_on, crash_on, sleep_on

    def available(self, device):
        return True, ""

    def forward(self, w):
        lens = tuple(w.seqlens)
        if lens in self.crash_on:
            os._exit(3)  # the worker process dies (as on a segfault or an OOM kill)
        if lens in self.fail_on:
            raise RuntimeError(f"kernel exploded at seqlens={lens}")
        if lens in self.sleep_on:
            time.sleep(60)
        return chunk_gated_delta_rule_ref(w.q, w.k, w.v, w.g, w.beta, scale=w.scale, initial_state=w.h0,
                                          output_final_state=True, cu_seqlens=w.cu_seqlens)


class Unpicklable(Scripted):
    """Fails while the worker unpickles its arguments: the worker dies before its first case."""

    def __reduce__(self):
        return (_explode, ())


def _explode():
    raise RuntimeError("cannot rebuild this backend in the worker")


def _cases(patterns=("1x24", "16+8", "8x3", "1x40")):
    return [Case("fwd", p, parse_pattern(s)) for p in PRESETS for s in patterns]


def _cfg():
    return RunConfig(device="cpu", warmup=0, repeats=2, head_dim=16)


def _sharded(tmp_path, backends, cases, workers=2):
    out = tmp_path / "r.json"
    res = R.new_results({"gpu_name": None}, {"argv": []})
    msgs = []
    SH.run_sharded(_cfg(), backends, res, out, cases, SH.resolve_slots(None, workers, "cpu"), progress=False,
                   echo=msgs.append)
    return res, out, msgs


# --- choosing GPUs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("spec,n,want", [
    ("all", 2, [0, 1]), ("ALL", 1, [0]), ("1", 2, [0]), ("2", 2, [0, 1]), ("1,", 2, [1]),
    ("0,2,5", 8, [0, 2, 5]), ("5, 2", 8, [5, 2]),
], ids=lambda x: str(x))
def test_parse_gpus(spec, n, want):
    assert SH.parse_gpus(spec, n) == want


@pytest.mark.parametrize("spec,n,needle", [
    ("7", 2, "--gpus 7: asks for 7 GPUs but 2 GPUs visible (indices 0..1)"),
    ("0,5", 2, "GPU index 5 does not exist"),
    ("3,", 2, "GPU index 3 does not exist"),
    ("1,1", 2, "GPU index 1 given twice"),
    ("0", 2, "at least 1"),
    ("gpu0", 2, "'gpu0'"),
    ("all", 0, "no CUDA GPU"),
], ids=lambda x: str(x))
def test_parse_gpus_rejects(spec, n, needle):
    with pytest.raises(ValueError) as e:
        SH.parse_gpus(spec, n)
    assert needle in str(e.value)


def test_cli_bad_gpus_exit_2(monkeypatch, tmp_path):
    out = str(tmp_path / "x.json")
    res = _invoke("run", "--cfg", "hk2_hv4", "--quick", "--device", "cpu", "--gpus", "all", "--out", out)
    assert res.exit_code == 2 and "--gpus all:" in res.output and "--workers N" in res.output
    res = _invoke("run", "--cfg", "hk2_hv4", "--quick", "--device", "cpu", "--gpus", "1", "--workers", "2",
                  "--out", out)
    assert res.exit_code == 2 and "exclude each other" in res.output
    # a machine with 2 GPUs (as torch reports it): --gpus 7 names the value, before any device work
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    res = _invoke("run", "--cfg", "hk2_hv4", "--device", "cuda", "--gpus", "7", "--out", out)
    assert res.exit_code == 2 and "--gpus 7" in res.output and "2 GPUs visible" in res.output
    res = _invoke("run", "--cfg", "hk2_hv4", "--device", "cuda", "--workers", "2", "--out", out)
    assert res.exit_code == 2 and "--workers 2 is for CPU runs" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "x.json").exists()


# --- the plan --------------------------------------------------------------------------------------


def test_plan_keeps_presets_together_and_covers_everything():
    groups = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    plan = SH.plan_shards([1.0] * 12, groups, 3)
    assert sorted(i for s in plan for i in s) == list(range(12))
    assert sorted({groups[i] for i in s} == {g} for s in plan for g in "abc").count(True) == 3
    assert [len(s) for s in plan] == [4, 4, 4]
    assert SH.plan_shards([1.0] * 12, groups, 3) == plan  # deterministic
    # one preset alone over 2 workers: cut into two contiguous halves
    assert SH.plan_shards([1.0] * 6, ["a"] * 6, 2) == [[0, 1, 2], [3, 4, 5]]
    # more workers than cases: some idle, nothing duplicated
    assert sorted(map(len, SH.plan_shards([1.0, 2.0], ["a", "b"], 4))) == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="at least one worker"):
        SH.plan_shards([1.0], ["a"], 0)


@pytest.mark.parametrize("sweep", ["h200-fwd", "h200-bwd"])
def test_plan_balances_the_h200_matrices_by_cost(sweep):
    sw = load_sweep(sweep)
    cfg = RunConfig(device="cuda")
    costs = [SH.case_cost(c, cfg, 3) for c in sw.cases]
    groups = [c.preset.name for c in sw.cases]
    for n in (2, 3, 4, 8):
        plan = SH.plan_shards(costs, groups, n)
        assert sorted(i for s in plan for i in s) == list(range(len(costs)))
        assert all(s == sorted(s) for s in plan)
        share = sum(costs) / n
        loads = [sum(costs[i] for i in s) / share for s in plan]
        assert max(loads) <= 1 + SH.BALANCE_SLACK + 1e-9, (n, [round(x, 2) for x in loads])
        # a preset is split only where balance needs it: few (preset, worker) pairs beyond one per preset
        # (h200-bwd at 8 workers: 5 presets x 2 phases over 8 workers takes 15 pairs)
        pairs = sum(len({groups[i] for i in s}) for s in plan)
        assert pairs <= len(set(groups)) + n + 2, (n, pairs)
    assert SH.plan_shards(costs, groups, 8) == SH.plan_shards(costs, groups, 8)


def test_case_cost_weighs_heads_tokens_and_phase():
    sw = load_sweep("h200-fwd")
    cfg = RunConfig(device="cuda")
    hv64 = next(c for c in sw.cases if c.preset.h_v == 64 and c.pattern.name == "1x32768")
    hv8 = next(c for c in sw.cases if c.preset.h_v == 8 and c.pattern.name == "1x32768")
    assert SH.case_cost(hv64, cfg) == 8 * SH.case_cost(hv8, cfg)
    assert SH.case_cost(hv8, cfg, 3) == 3 * SH.case_cost(hv8, cfg)
    assert SH.case_cost(Case("bwd", hv8.preset, hv8.pattern), cfg) == 3 * SH.case_cost(hv8, cfg)
    tiny = Case("fwd", hv8.preset, parse_pattern("1x64"))
    assert SH.case_cost(tiny, cfg) == SH.case_cost(Case("fwd", hv8.preset, parse_pattern("1x4096")), cfg)


# --- worker pools on the CPU -----------------------------------------------------------------------


def test_cli_workers_match_a_single_process_run_and_resume_across_shards(tmp_path):
    single = _cli_run(tmp_path / "one.json")
    out = tmp_path / "two.json"
    sharded = _cli_run(out, "--workers", "2")
    keys = [R.row_key(r) for r in single["rows"]]
    assert len(keys) == 8 and len(set(keys)) == 8
    assert [R.row_key(r) for r in sharded["rows"]] == keys  # same rows, same order
    assert {r["status"] for r in sharded["rows"]} == {"ok"}
    for r in sharded["rows"]:
        assert r["median_ms"] > 0 and max(r["errors"].values()) < 0.02
        assert r["gpu_index"] is None and r["gpu_uuid"] is None
    assert {r["worker"] for r in sharded["rows"]} == {0, 1}
    assert {r["worker"] for r in single["rows"]} == {None}
    # one preset per worker here (equal costs): compile caches would stay warm
    by_worker = {w: {r["preset"] for r in sharded["rows"] if r["worker"] == w} for w in (0, 1)}
    assert sorted(map(sorted, by_worker.values())) == [["hk1_hv4"], ["hk2_hv4"]]
    assert sharded["run"]["workers"] == 2 and single["run"]["workers"] is None
    assert [w["worker"] for w in sharded["env"]["workers"]] == [0, 1]
    assert not SH.shard_dir(out).exists()  # partial files merged and removed

    # --resume across shards: an error row and a missing row (one per preset) run again, nothing else
    rows = sharded["rows"]
    for r in rows:
        r["timestamp"] = "2000-01-01T00:00:00+00:00"
    rows[1].update(status="error", median_ms=None, message="boom")
    redo = {R.row_key(rows[1]), R.row_key(rows.pop(6))}
    R.save(sharded, out)
    again = _cli_run(out, "--workers", "2", "--resume")
    assert [R.row_key(r) for r in again["rows"]] == keys and {r["status"] for r in again["rows"]} == {"ok"}
    rerun = {R.row_key(r) for r in again["rows"] if r["timestamp"] > "2000-01-01T00:00:00+00:00"}
    assert rerun == redo
    assert len(again["env"]["resumed_at"]) == 1


def test_failing_case_and_dying_worker_become_error_rows(tmp_path):
    b = Scripted(fail_on={(16, 8)}, crash_on={(8, 8, 8)})
    cases = _cases()
    res, out, msgs = _sharded(tmp_path, [b], cases)
    by = {(r["preset"], r["pattern"]): r for r in R.load(out)["rows"]}
    assert len(by) == 8 and len(res["rows"]) == 8
    for p in ("hk1_hv2", "hk2_hv2"):
        assert by[p, "1x24"]["status"] == "ok" and by[p, "1x40"]["status"] == "ok"
        err = by[p, "16+8"]
        assert err["status"] == "error" and "kernel exploded" in err["message"] and err["median_ms"] is None
        died = by[p, "8x3"]
        assert died["status"] == "error" and "died during this case (exit code 3)" in died["message"]
    # each worker kept its preset; after the crash a fresh worker of the same slot ran the last case
    homes = [{by[p, s]["worker"] for s in ("1x24", "16+8", "8x3", "1x40")} for p in ("hk1_hv2", "hk2_hv2")]
    assert sorted(homes, key=min) == [{0}, {1}]
    assert sum("died (exit code 3)" in m and "1 remaining cases" in m for m in msgs) == 2


def test_worker_that_cannot_start_gives_error_rows(tmp_path):
    cases = _cases(("1x24",))
    _, out, msgs = _sharded(tmp_path, [Unpicklable("broken")], cases, workers=1)
    rows = R.load(out)["rows"]
    assert len(rows) == 2 and {r["status"] for r in rows} == {"error"}
    assert all("could not run" in r["message"] and "before its first case" in r["message"] for r in rows)
    assert {r["worker"] for r in rows} == {0} and sum("could not run" in m for m in msgs) == 1


def test_interrupt_stops_workers_and_keeps_merged_rows(tmp_path, monkeypatch):
    # the parent is interrupted (as by Ctrl-C) once 3 rows are in; worker 1 is stuck in a long call
    b = Scripted(sleep_on={(40,)})
    merge = SH.ShardedRun._merge

    def merge_then_interrupt(self, row, save=True):
        merge(self, row, save)
        if len(self.merged) == 3:
            self.stopped_at = time.monotonic()
            raise KeyboardInterrupt

    monkeypatch.setattr(SH.ShardedRun, "_merge", merge_then_interrupt)
    out = tmp_path / "r.json"
    res = R.new_results({"gpu_name": None}, {"argv": []})
    cases = [Case("fwd", PRESETS[0], parse_pattern("1x24")), Case("fwd", PRESETS[0], parse_pattern("16+8")),
             Case("fwd", PRESETS[1], parse_pattern("1x24")), Case("fwd", PRESETS[1], parse_pattern("1x40"))]
    run = SH.ShardedRun(_cfg(), [b], res, out, cases, SH.resolve_slots(None, 2, "cpu"), progress=False,
                        echo=lambda m: None)
    with pytest.raises(KeyboardInterrupt):
        run.run()
    assert time.monotonic() - run.stopped_at < SH.STOP_GRACE_S  # workers stopped on SIGTERM, not killed
    assert all(w.proc.exitcode is not None for w in run.workers)
    rows = R.load(out)["rows"]
    assert len(rows) >= 3 and {r["status"] for r in rows} == {"ok"}
    assert ("hk2_hv2", "1x40") not in {(r["preset"], r["pattern"]) for r in rows}
    assert not SH.shard_dir(out).exists()


def test_resume_recovers_rows_left_by_a_dead_parent(tmp_path):
    out = tmp_path / "r.json"
    res = R.new_results({"gpu_name": None}, {"argv": []})
    R.save(res, out)
    # a worker's partial file from a run whose parent was killed before merging it
    part = R.new_results({"gpu_name": None}, {"worker": 0})
    ok = R.make_row(status="ok", phase="fwd", preset="hk1_hv2", h_qk=1, h_v=2, dtype="bfloat16", pattern="1x24",
                    gate_profile="bench", backend="scripted", median_ms=1.0, worker=0)
    R.upsert_row(part, ok)
    R.save(part, SH.shard_dir(out) / "worker0.0.json")
    b = Scripted(crash_on={(24,)})  # would die if the recovered case ran again
    SH.run_sharded(_cfg(), [b], res, out, [Case("fwd", PRESETS[0], parse_pattern("1x24"))],
                   SH.resolve_slots(None, 1, "cpu"), progress=False, echo=lambda m: None, recover=True)
    rows = R.load(out)["rows"]
    assert [(r["pattern"], r["status"], r["median_ms"]) for r in rows] == [("1x24", "ok", 1.0)]
    assert not SH.shard_dir(out).exists()


def test_files_without_gpu_fields_still_load(tmp_path):
    res = R.new_results({"gpu_name": None}, {"argv": []})
    old = R.make_row(status="ok", phase="fwd", preset="hk1_hv2", h_qk=1, h_v=2, dtype="bfloat16", pattern="1x24",
                     gate_profile="bench", backend="torch", median_ms=1.0)
    for k in R.OPTIONAL_ROW_FIELDS:
        del old[k]  # as written before the fields existed
    res["rows"].append(old)
    path = R.save(res, tmp_path / "old.json")
    assert R.load(path)["rows"][0]["median_ms"] == 1.0
    df = R.to_dataframe(path)
    assert df["gpu_index"].isna().all() and df["worker"].isna().all() and df["median_ms"].tolist() == [1.0]


# --- on GPUs ---------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpus_all_matches_one_gpu_run(tmp_path):
    args = ("--cfg", "hk2_hv4", "--seqlens", "1x2048,1024x2,512+1536", "--phase", "fwd,bwd", "--backends", "torch",
            "--quick", "--no-progress")
    one = _invoke("run", *args, "--out", str(tmp_path / "one.json"))
    assert one.exit_code == 0, one.output
    many = _invoke("run", *args, "--gpus", "all", "--out", str(tmp_path / "all.json"))
    assert many.exit_code == 0, many.output
    a, b = R.load(tmp_path / "one.json"), R.load(tmp_path / "all.json")
    assert [R.row_key(r) for r in b["rows"]] == [R.row_key(r) for r in a["rows"]] and len(a["rows"]) == 6
    assert {r["status"] for r in b["rows"]} == {"ok"}
    n = torch.cuda.device_count()
    uuids = {s.gpu_index: s.gpu_uuid for s in SH.resolve_slots("all", None, "cuda")}
    for r in b["rows"]:
        assert r["gpu_index"] in uuids and r["gpu_uuid"] == uuids[r["gpu_index"]]
        assert r["gpu_uuid"].startswith("GPU-")
    assert {r["gpu_index"] for r in a["rows"]} == {0} and b["run"]["gpus"] == list(range(n))
    assert len({r["gpu_index"] for r in b["rows"]}) == min(n, 6)  # the plan spreads 6 cases over every GPU
    bad = _invoke("run", *args, "--gpus", str(n + 1), "--out", str(tmp_path / "bad.json"))
    assert bad.exit_code == 2 and f"--gpus {n + 1}" in bad.output
