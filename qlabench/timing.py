"""Measurement: CUDA-graph replay (default on GPUs), CUDA events with an L2 flush, or host wall clock.

Timers (``measure``):
    cudagraph  ``n`` calls captured into one CUDA graph, replayed ``repeats`` times; one sample =
               replay time / n (launch gaps hidden, like FlashQLA's published numbers). L2 stays warm
               between calls unless ``l2="flush"``: then every captured call is preceded by a 256 MB
               write and the median time of a flush-only graph is subtracted.
    events     one call per sample between CUDA events, the 256 MB buffer written before each sample
               (outside the events) so every sample starts with a cold L2. Used when graph capture fails
               (host syncs inside the call, unsupported ops); the row records why.
    wall       ``time.perf_counter`` around each call (with device syncs on CUDA): the CPU timer.

Warm-up calls run first and never enter the statistics; the very first call of a backend on a case
(compilation, autotuning) is timed apart by ``first_call``. Statistics are over per-call samples:
median, p20, p80, min, mean, standard deviation and the sample count.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

DEFAULT_WARMUP = 10  # calls before measuring (FlashQLA's benchmark uses 10)
DEFAULT_REPEATS = 100  # samples: graph replays (cudagraph), timed calls (events, wall)
TIMERS = ("auto", "cudagraph", "events", "wall")
L2_POLICIES = ("auto", "warm", "flush")
FLUSH_BYTES = 256 * 2**20
GRAPH_TARGET_MS = 1.0  # calls per graph are chosen so one replay lasts about this long
GRAPH_MAX_CALLS = 16

_flush_buffers: dict[str, torch.Tensor] = {}


@dataclass
class Timing:
    """Per-call samples in milliseconds and how they were taken."""

    timer: str
    l2_policy: str
    samples_ms: list[float]
    calls_per_sample: int = 1
    note: str = ""
    extra: dict = field(default_factory=dict)

    def stats(self) -> dict:
        a = np.asarray(self.samples_ms, dtype=np.float64)
        if a.size == 0:
            raise ValueError("no timing samples")
        return {
            "median_ms": float(np.median(a)),
            "p20_ms": float(np.percentile(a, 20)),
            "p80_ms": float(np.percentile(a, 80)),
            "min_ms": float(a.min()),
            "mean_ms": float(a.mean()),
            "std_ms": float(a.std(ddof=1)) if a.size > 1 else 0.0,
            "samples": int(a.size),
        }


def resolve_timer(timer: str, device: str) -> str:
    if timer not in TIMERS:
        raise ValueError(f"timer must be one of {', '.join(TIMERS)}, got {timer!r}")
    if device != "cuda":
        if timer in ("cudagraph", "events"):
            raise ValueError(f"timer {timer!r} needs a CUDA device, got device={device!r}")
        return "wall"
    return "cudagraph" if timer == "auto" else timer


def resolve_l2(l2: str, timer: str) -> str:
    """The L2 policy a timer runs with: cudagraph warm, events flush, wall n/a unless asked."""
    if l2 not in L2_POLICIES:
        raise ValueError(f"l2 policy must be one of {', '.join(L2_POLICIES)}, got {l2!r}")
    if timer == "wall":
        return "n/a"
    if l2 == "auto":
        return "warm" if timer == "cudagraph" else "flush"
    return l2


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _flush_buffer() -> torch.Tensor:
    key = str(torch.cuda.current_device())
    if key not in _flush_buffers:
        _flush_buffers[key] = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    return _flush_buffers[key]


def flush_l2() -> None:
    """Writes 256 MB (over 5x the H200's 50 MB L2), evicting whatever the last call left there."""
    _flush_buffer().zero_()


def bench_stream(device: str):
    """A side stream for GPU work (graph capture cannot run on the legacy default stream)."""
    return torch.cuda.Stream() if device == "cuda" else None


@contextlib.contextmanager
def on_stream(stream):
    """Runs the block on ``stream`` after it has waited for the work queued so far."""
    if stream is None:
        yield
        return
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream().wait_stream(stream)


def first_call(fn, device: str):
    """(seconds, result) of one synchronised call: compilation and autotuning land here."""
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t0, out


def peak_memory_mb(fn, device: str) -> float | None:
    """Extra device memory (MiB) one call holds at its peak, beyond what was allocated before it."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**20


def _event_times(fn, n: int, flush: bool) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        if flush:
            flush_l2()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def _graph_of(fn, calls: int, flush: bool):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.current_stream()):
        for _ in range(calls):
            if flush:
                flush_l2()
            if fn is not None:
                fn()
    return graph


def _replay_times(graph, n: int) -> list[float]:
    return _event_times(graph.replay, n, flush=False)


def _measure_cudagraph(fn, warmup: int, repeats: int, l2: str) -> Timing:
    est = _event_times(fn, max(warmup, 1), flush=False)
    per_call = float(np.median(est))
    calls = int(min(GRAPH_MAX_CALLS, max(1, math.ceil(GRAPH_TARGET_MS / max(per_call, 1e-3)))))
    flush = l2 == "flush"
    if flush:
        _flush_buffer()  # allocate outside the capture (not from the graph's private pool)
    graph = _graph_of(fn, calls, flush)
    flush_graph = _graph_of(None, calls, True) if flush else None
    try:
        _replay_times(graph, 2)  # first replays upload the graph
        samples = [t / calls for t in _replay_times(graph, repeats)]
        extra = {}
        if flush_graph is not None:
            _replay_times(flush_graph, 2)
            flush_ms = float(np.median(_replay_times(flush_graph, repeats))) / calls
            samples = [t - flush_ms for t in samples]
            extra["flush_ms"] = flush_ms
    finally:
        del graph, flush_graph
    return Timing("cudagraph", l2, samples, calls_per_sample=calls, extra=extra)


def measure(fn, device: str, timer: str = "auto", warmup: int = DEFAULT_WARMUP,
            repeats: int = DEFAULT_REPEATS, l2: str = "auto") -> Timing:
    """Times ``fn`` (a call with no arguments) on ``device``; see the module docstring.

    On CUDA, run this inside ``on_stream(bench_stream("cuda"))`` so graph capture has a side stream
    (``fn``'s setup, e.g. the forward before a timed backward, should have run on that stream too).
    """
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    timer = resolve_timer(timer, device)
    policy = resolve_l2(l2, timer)
    if timer == "wall":
        for _ in range(warmup):
            fn()
        _sync(device)
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            _sync(device)
            samples.append((time.perf_counter() - t0) * 1e3)
        return Timing("wall", policy, samples)
    note = ""
    if timer == "cudagraph":
        try:
            return _measure_cudagraph(fn, warmup, repeats, policy)
        except Exception as e:  # noqa: BLE001 - any capture failure falls back to events
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
            note = f"cudagraph capture failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); " \
                   "timed with CUDA events"
            policy = "flush" if l2 in ("auto", "flush") else "warm"
    if policy == "flush":
        _flush_buffer()
    _event_times(fn, warmup, flush=False)
    samples = _event_times(fn, repeats, flush=policy == "flush")
    return Timing("events", policy, samples, note=note)


KERNEL_SPLIT_CALLS = 3  # profiled calls per row of `run --kernel-split`


def kernel_split(fn, device: str, calls: int = KERNEL_SPLIT_CALLS) -> dict[str, float]:
    """Per-kernel time of ``fn``: {kernel name: microseconds per call}, largest first.

    ``calls`` calls (after one unprofiled call) under torch.profiler. On CUDA each GPU kernel's device
    time, summed per kernel name (the split sums to the calls' device time, launch gaps excluded); on
    the CPU each operator's self CPU time (how the path is tested without a GPU).
    """
    from torch.profiler import ProfilerActivity, profile

    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    cuda = device == "cuda"
    fn()
    _sync(device)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(calls):
            fn()
        _sync(device)
    return split_from_events(prof.events(), cuda, calls)


def split_from_events(events, cuda: bool, calls: int) -> dict[str, float]:
    """{name: us per call} from profiler events: GPU kernels' durations (``cuda``) or CPU operators'
    self times, summed per name and divided by ``calls``; largest first, zeros dropped."""
    totals: dict[str, float] = {}
    for e in events:
        is_gpu = e.device_type == torch.autograd.DeviceType.CUDA
        if cuda != is_gpu:
            continue
        us = e.time_range.elapsed_us() if cuda else e.self_cpu_time_total
        if us > 0:
            totals[e.name] = totals.get(e.name, 0.0) + float(us)
    return {k: round(v / calls, 3) for k, v in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))}
