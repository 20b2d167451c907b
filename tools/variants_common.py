"""Pieces shared by tools/fwd_variants.py and tools/bwd_variants.py (imported as a sibling module:
the tools run as scripts, `python tools/<name>.py`, with tools/ first on sys.path)."""

from __future__ import annotations


def rel_l2(a, b) -> float:
    """Relative L2 error of a against b, in float64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def kernel_split(fn, calls: int = 5) -> dict[str, float]:
    """Device time per kernel name (ms per call, torch.profiler, mean of ``calls`` calls), largest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        if ev.device_type.name == "CUDA" and getattr(ev, "device_time_total", 0) > 0:
            out[ev.key[:48]] = ev.device_time_total / calls / 1000.0
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
