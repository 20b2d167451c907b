"""Baselines on a GPU: correctness against the float64 reference, the FLA-path check, the CUDA timers.

Every test needs CUDA (``@pytest.mark.gpu``); a backend whose library is missing is skipped with its
own availability reason.
"""

from __future__ import annotations

import pytest
import torch

from qlabench import runner as RN
from qlabench import timing as T
from qlabench.backends import GRAD_NAMES, get_backend
from qlabench.check import compare
from qlabench.config import Case, Preset
from qlabench.workload import make_workload, parse_pattern

pytestmark = pytest.mark.gpu

BACKENDS = ["torch", "fla", "flash_qla", "qla"]
PRESET = Preset("hk2_hv8", 2, 8, "397B/122B TP8")
PATTERN = parse_pattern("1500+2596")  # a partial last chunk in both sequences


def _backend(name):
    b = get_backend(name)
    ok, why = b.available("cuda")
    if not ok:
        pytest.skip(f"{name} unavailable: {why}")
    return b


@pytest.fixture(scope="module")
def workload():
    return make_workload(PRESET.h_qk, PRESET.h_v, PATTERN.seqlens, "bench", seed=5, device="cuda")


@pytest.mark.parametrize("name", BACKENDS)
def test_forward_matches_reference(name, workload):
    b = _backend(name)
    ref = RN.reference_outputs("fwd", workload)
    with torch.no_grad():
        o, ht = b.forward(workload)
    assert o.shape == workload.v.shape and ht.shape == workload.h0.shape and ht.dtype in (torch.float32,
                                                                                           torch.float64)
    v = compare({"o": o, "final_state": ht}, ref)
    assert v.ok, v.message()
    assert max(v.errors.values()) < 0.02


@pytest.mark.parametrize("name", BACKENDS)
def test_backward_matches_reference(name, workload):
    b = _backend(name)
    ref = RN.reference_outputs("bwd", workload)
    call = RN._PhaseCall("bwd", b, workload)
    call.prepare()
    out = call.named(call())
    v = compare(out, ref)
    assert set(v.errors) == {"o", "final_state", *GRAD_NAMES}
    assert v.ok, v.message()


@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_fla_runs_its_triton_path(phase, workload):
    b = _backend("fla")
    case = Case(phase, PRESET, PATTERN)
    ref = RN.reference_outputs(phase, workload)
    cfg = RN.RunConfig(device="cuda", warmup=2, repeats=5)
    row = RN.run_backend_case(case, workload, ref, b, cfg, RN.base_row(case, PATTERN.seqlens, cfg))
    assert row["status"] == "ok", row["message"]
    names = row["kernels"]
    assert names and not any(s in n.lower() for n in names for s in ("tilelang", "flash_qla", "fused_gdr"))
    assert any("chunk" in n for n in names)
    assert row["backend_version"]


def test_cudagraph_timer_and_event_fallback(workload):
    x = torch.randn(4096, 4096, device="cuda")
    stream = T.bench_stream("cuda")
    with T.on_stream(stream):
        t = T.measure(lambda: x @ x, "cuda", warmup=3, repeats=10)
        assert t.timer == "cudagraph" and t.l2_policy == "warm" and t.calls_per_sample >= 1
        s = t.stats()
        assert 0 < s["min_ms"] <= s["median_ms"] < 50 and s["samples"] == 10
        tf = T.measure(lambda: x @ x, "cuda", warmup=3, repeats=10, l2="flush")
        assert tf.l2_policy == "flush" and tf.extra["flush_ms"] > 0

        def syncs():  # a host sync inside the call: graph capture must fail, events take over
            return (x @ x).sum().item()

        te = T.measure(syncs, "cuda", warmup=2, repeats=5)
        assert te.timer == "events" and "capture failed" in te.note and te.l2_policy == "flush"
        ev = T.measure(lambda: x @ x, "cuda", timer="events", warmup=2, repeats=5)
        assert ev.timer == "events" and ev.stats()["median_ms"] > 0
    mb = T.peak_memory_mb(lambda: x @ x, "cuda")
    assert mb == pytest.approx(64.0, rel=0.1)  # one 4096 x 4096 fp32 output


def test_runner_on_gpu_with_torch_backend(tmp_path):
    from qlabench import results as R

    cases = [Case(ph, Preset("hk1_hv2", 1, 2, "tiny"), parse_pattern("300+212")) for ph in ("fwd", "bwd")]
    res = R.new_results({"gpu_name": torch.cuda.get_device_name()}, {"argv": []})
    cfg = RN.RunConfig(device="cuda", warmup=1, repeats=3)
    RN.Runner(cfg, [get_backend("torch")], res, tmp_path / "r.json", progress=False).run(cases)
    rows = R.load(tmp_path / "r.json")["rows"]
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert all(r["median_ms"] > 0 and r["peak_mem_mb"] > 0 for r in rows)
