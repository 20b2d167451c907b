"""pytest-benchmark suite over the `ci-smoke` forward cases of our (`qla`) backend. GPU only.

    pytest tests/perf --benchmark-autosave                         # store a baseline (.benchmarks/)
    pytest tests/perf --benchmark-compare --benchmark-compare-fail=median:5%

Each benchmarked call runs the forward and then `torch.cuda.synchronize()`, so the time pytest-benchmark
records covers the GPU work, not just the launch. Inputs are built once per case outside the timed
region; the first (compiling) call happens in the untimed warm-up. On a machine without CUDA every
test skips with the reason, and collection never imports torch.cuda state or the kernels.
"""

from __future__ import annotations

import pytest

SWEEP = "ci-smoke"
WARMUP_CALLS = 3


def _case_ids() -> list:
    """Forward cases of the sweep as params; a loading problem becomes one skipped param."""
    try:
        from qlabench.config import load_sweep

        cases = [c for c in load_sweep(SWEEP).cases if c.phase == "fwd"]
    except Exception as exc:  # noqa: BLE001 - collection must not fail on CPU or a broken config
        return [pytest.param(None, id="unloadable", marks=pytest.mark.skip(reason=f"{SWEEP}: {exc}"))]
    return [pytest.param(c, id=c.label) for c in cases]


@pytest.mark.gpu
@pytest.mark.parametrize("case", _case_ids())
def test_qla_forward(benchmark, case):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from qlabench.backends import get_backend
    from qlabench.workload import make_workload

    backend = get_backend("qla")
    ok, why = backend.available("cuda")
    if not ok:
        pytest.skip(f"qla unavailable: {why}")
    w = make_workload(case.preset.h_qk, case.preset.h_v, case.pattern.seqlens, gate_profile=case.gate_profile,
                      seed=0, device="cuda")

    def run():
        out = backend.forward(w)
        torch.cuda.synchronize()
        return out

    with torch.no_grad():
        for _ in range(WARMUP_CALLS):  # compile + warm caches outside the measurement
            run()
        benchmark.extra_info.update(
            {"preset": case.preset.name, "pattern": case.pattern.name, "gpu": torch.cuda.get_device_name()}
        )
        o, ht = benchmark.pedantic(run, rounds=20, iterations=5, warmup_rounds=1)
    assert o.shape == w.v.shape and torch.isfinite(o.float()).all()
    assert ht.shape == (len(case.pattern.seqlens), case.preset.h_v, w.q.shape[-1], w.v.shape[-1])
