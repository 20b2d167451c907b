"""Synthetic results documents (schema `qlabench.results/1`) for tests and demos of the reports.

Nothing here measures anything: times are whatever the caller says, dispersion is a fixed fraction
around the median. Used by the CPU tests of tables, plots, compare, gate and history.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from qlabench.results import SCHEMA


def pattern_seqlens(pattern: str) -> list[int]:
    """Sequence lengths of a pattern label: `1x32768`, `8192x4`, `28672+4096`, `32k_4seq`."""
    m = re.fullmatch(r"(\d+)x(\d+)", pattern)
    if m:
        a, b = int(m.group(1)), int(m.group(2))
        return [b] if a == 1 else [a] * b
    if re.fullmatch(r"\d+(\+\d+)+", pattern):
        return [int(x) for x in pattern.split("+")]
    m = re.fullmatch(r"(\d+)k_(\d+)seq", pattern)
    if m:
        total, n = int(m.group(1)) * 1024, int(m.group(2))
        return [total // n] * (n - 1) + [total - (total // n) * (n - 1)]
    raise ValueError(f"unknown seqlen pattern {pattern!r}")


def make_row(
    phase: str,
    h_qk: int,
    h_v: int,
    pattern: str,
    backend: str,
    median_ms: float | None,
    status: str = "ok",
    spread: float = 0.01,
    preset: str | None = None,
    model: str | None = None,
    gate_profile: str = "bench",
    dtype: str = "bfloat16",
    backend_version: str | None = None,
    timer: str = "cudagraph",
) -> dict:
    """One row; ``spread`` puts p20/p80 at median x (1 -/+ spread). Rows that are ok or incorrect carry
    times (an incorrect row was still timed); error and unavailable rows get null times."""
    seqlens = pattern_seqlens(pattern)
    if status in ("ok", "incorrect") and median_ms is None:
        raise ValueError(f"a {status} row needs median_ms")
    timed = status in ("ok", "incorrect")
    m = float(median_ms) if timed else None
    return {
        "phase": phase,
        "preset": preset or f"hk{h_qk}_hv{h_v}",
        "model": model or f"hk{h_qk}_hv{h_v}",
        "h_qk": h_qk,
        "h_v": h_v,
        "pattern": pattern,
        "seqlens": seqlens,
        "total_tokens": sum(seqlens),
        "n_seqs": len(seqlens),
        "gate_profile": gate_profile,
        "dtype": dtype,
        "backend": backend,
        "status": status,
        "median_ms": m,
        "p20_ms": m * (1 - spread) if timed else None,
        "p80_ms": m * (1 + spread) if timed else None,
        "min_ms": m * (1 - 2 * spread) if timed else None,
        "mean_ms": m if timed else None,
        "std_ms": m * spread if timed else None,
        "samples": 100 if timed else 0,
        "timer": timer if timed else None,
        "l2_policy": "flush",
        "first_call_s": 1.5 if timed else None,
        "peak_mem_mb": 512.0 if timed else None,
        "errors": {"o": 1e-3} if status in ("ok", "incorrect") else {},
        "message": "" if status == "ok" else f"synthetic {status}",
        "backend_version": backend_version,
        "timestamp": "2026-12-01T00:00:00Z",
    }


def make_results(
    rows: list[dict],
    gpu_name: str = "NVIDIA H200",
    timestamp: str = "2026-12-01T00:00:00Z",
    git_commit: str = "0000000",
    versions: dict[str, Any] | None = None,
    device: str = "cuda",
) -> dict:
    """A whole results document around ``rows``."""
    vers = {
        "torch": "2.11.0+cu130",
        "triton": "3.6.0",
        "tilelang": "0.1.15",
        "fla": "0.6.0",
        "flash_qla": "0.1.3",
        "qlabench": "0.1.0",
    }
    vers.update(versions or {})
    return {
        "schema": SCHEMA,
        "env": {
            "gpu_name": gpu_name,
            "gpu_uuid": "GPU-synthetic",
            "compute_capability": "9.0",
            "sm_count": 132,
            "driver": "580.00",
            "cuda": "13.0",
            "clocks_start": {"sm_mhz": 1980, "mem_mhz": 3201},
            "clocks_end": {"sm_mhz": 1980, "mem_mhz": 3201},
            "versions": vers,
            "git_commit": git_commit,
            "git_dirty": False,
            "timestamp": timestamp,
            "hostname": "synthetic",
            "device": device,
        },
        "run": {
            "argv": ["qlabench", "run", "--sweep", "synthetic"],
            "sweep": "synthetic",
            "arch": "sm90",
            "seed": 0,
            "phases": sorted({r["phase"] for r in rows}),
            "backends": list(dict.fromkeys(r["backend"] for r in rows)),
            "gate_profile": "bench",
            "timer": "cudagraph",
            "warmup": 10,
            "repeats": 100,
            "l2_policy": "flush",
            "quick": False,
            "tolerance": 2e-2,
        },
        "rows": copy.deepcopy(rows),
    }


def demo_results(gpu_name: str = "NVIDIA H200") -> dict:
    """A small two-preset, three-backend, fwd+bwd document with one row of each non-ok status."""
    rows: list[dict] = []
    fwd = {  # (h_qk, h_v, model): {pattern: (qla, fla, flash_qla)}
        (16, 16, "2B/0.8B TP1"): {
            "1x32768": (0.378, 1.231, 0.380),
            "28672+4096": (0.39, 1.20, 0.40),
            "8192x4": (0.387, 0.887, 0.39),
            "1x8192": (0.12, 0.33, 0.125),
        },
        (16, 32, "35B/9B/4B TP1"): {
            "1x32768": (0.668, 1.916, 0.67),
            "28672+4096": (0.691, 1.933, 0.70),
            "8192x4": (0.61, 1.89, 0.62),
            "1x8192": (0.28, 0.47, 0.28),
        },
    }
    for (hq, hv, model), pats in fwd.items():
        for pat, times in pats.items():
            for backend, t in zip(("qla", "fla", "flash_qla"), times):
                rows.append(make_row("fwd", hq, hv, pat, backend, t, model=model))
    rows.append(make_row("fwd", 16, 16, "1x2048", "qla", 0.05, status="incorrect", model="2B/0.8B TP1"))
    rows.append(make_row("fwd", 16, 16, "1x2048", "fla", 0.102, model="2B/0.8B TP1"))
    rows.append(make_row("fwd", 16, 16, "1x2048", "flash_qla", None, status="error", model="2B/0.8B TP1"))
    bwd = {
        (16, 16): {"32k_1seq": (0.95, 3.558), "32k_4seq": (1.10, 3.24)},
        (16, 32): {"32k_1seq": (1.957, 6.206), "32k_4seq": (2.1, 5.72)},
    }
    for (hq, hv), pats in bwd.items():
        for pat, (q, f) in pats.items():
            rows.append(make_row("bwd", hq, hv, pat, "qla", q))
            rows.append(make_row("bwd", hq, hv, pat, "fla", f))
            rows.append(make_row("bwd", hq, hv, pat, "flash_qla", None, status="unavailable"))
    return make_results(rows, gpu_name=gpu_name)
