"""Timer selection and statistics (qlabench/timing.py); the CUDA timers are exercised by GPU tests."""

from __future__ import annotations

import time

import pytest

from qlabench import timing as T


def test_stats_values():
    t = T.Timing("wall", "n/a", [1.0, 2.0, 3.0, 4.0, 5.0])
    s = t.stats()
    assert s["median_ms"] == 3.0 and s["min_ms"] == 1.0 and s["mean_ms"] == 3.0 and s["samples"] == 5
    assert s["p20_ms"] == pytest.approx(1.8) and s["p80_ms"] == pytest.approx(4.2)
    assert s["std_ms"] == pytest.approx(1.5811, rel=1e-3)
    with pytest.raises(ValueError):
        T.Timing("wall", "n/a", []).stats()


def test_resolve_timer_and_l2():
    assert T.resolve_timer("auto", "cpu") == "wall"
    assert T.resolve_timer("auto", "cuda") == "cudagraph"
    assert T.resolve_timer("events", "cuda") == "events"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        T.resolve_timer("cudagraph", "cpu")
    with pytest.raises(ValueError, match="'fast'"):
        T.resolve_timer("fast", "cpu")
    assert T.resolve_l2("auto", "cudagraph") == "warm"
    assert T.resolve_l2("auto", "events") == "flush"
    assert T.resolve_l2("flush", "wall") == "n/a"


def test_wall_timer_measures_the_call():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002)

    t = T.measure(fn, "cpu", warmup=2, repeats=5)
    assert len(calls) == 7 and t.timer == "wall" and t.l2_policy == "n/a"
    s = t.stats()
    assert s["samples"] == 5 and 1.9 < s["min_ms"] < 50
    secs, out = T.first_call(lambda: 42, "cpu")
    assert out == 42 and secs >= 0
    assert T.peak_memory_mb(fn, "cpu") is None
    with pytest.raises(ValueError, match="repeats"):
        T.measure(fn, "cpu", repeats=0)
