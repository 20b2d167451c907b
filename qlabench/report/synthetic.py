"""Synthetic results documents (schema `qlabench.results/1`) for tests and demos of the reports.

Nothing here measures anything: times are whatever the caller says, dispersion is a fixed fraction
around the median. Used by the CPU tests of tables, plots, compare, gate and history.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from qlabench.kernels.options import DEFAULTS as OPTION_DEFAULTS
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
    body = re.sub(r"\+pad\d+$", "", pattern)  # "N*L" terms and a padding tail (its tokens are not seqlens)
    if re.fullmatch(r"((\d+\*)?\d+\+)*(\d+\*)?\d+", body):
        out = []
        for term in body.split("+"):
            count, _, length = term.rpartition("*")
            out += [int(length)] * int(count or 1)
        return out
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
    errors: dict[str, float | None] | None = None,
    nonfinite: dict[str, int] | None = None,
    beta_profile: str = "sigmoid",
    h0_scale: float = 1.0,
) -> dict:
    """One row; ``spread`` puts p20/p80 at median x (1 -/+ spread). Rows that are ok or incorrect carry
    times (an incorrect row was still timed) and ``errors`` (default {"o": 1e-3}; None = non-finite);
    error and unavailable rows get null times and no errors."""
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
        "beta_profile": beta_profile,
        "h0_scale": float(h0_scale),
        "pad_tokens": int(pad.group(1)) if (pad := re.search(r"\+pad(\d+)$", pattern)) else 0,
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
        "errors": (dict(errors) if errors is not None else {"o": 1e-3}) if timed else {},
        "nonfinite": dict(nonfinite or {}) if timed else {},
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
            "option_defaults": dict(OPTION_DEFAULTS),
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


_STRESS_BASE = {"o": 4.3e-3, "final_state": 3.7e-3, "dq": 6.1e-3, "dk": 5.9e-3, "dv": 5.2e-3, "dg": 4.4e-3,
                "dbeta": 5.0e-3, "dh0": 3.1e-3}
STRESS_PATTERNS = ("1x8192", "512*1", "128*63+128*65", "256*1+64*63+64*65+pad1000")
DRIFT_LENGTHS = (8192, 16384, 32768, 65536, 131072, 262144)


def stress_results(gpu_name: str = "NVIDIA H200", tolerance: float = 2e-2) -> dict:
    """A document shaped like a run of the ``stress`` sweep, with per-tensor errors (made up, not measured).

    hk2_hv16, fwd and bwd, qla / fla / flash_qla over ``STRESS_PATTERNS`` x gates qwen, extreme, plus two
    beta / h0 variants; every error near bf16 rounding except: fla's backward dg over the tolerance on
    every strong-decay case, non-finite (37 NaN/Inf elements) on every second extreme one; flash_qla's
    forward o on the padded case (0.8). Drift: hk2_hv8 one sequence of 8k-256k tokens under bench and
    qwen, flash_qla's error growing 1.6x per doubling (over the tolerance from 128k on), the others flat.
    A row is incorrect when an error is over ``tolerance`` or null.
    """
    rows: list[dict] = []

    def add(phase, hq, hv, pattern, backend, errs, nonfinite=None, **kw):
        tokens = sum(pattern_seqlens(pattern))
        over = any(e is None or e > tolerance for e in errs.values())
        ms = tokens / 8192 * {"qla": 0.30, "fla": 0.36, "flash_qla": 0.20}[backend] * (3 if phase == "bwd" else 1)
        rows.append(make_row(phase, hq, hv, pattern, backend, ms, status="incorrect" if over else "ok",
                             errors=errs, nonfinite=nonfinite, **kw))

    for phase in ("fwd", "bwd"):
        tensors = ("o", "final_state") if phase == "fwd" else tuple(_STRESS_BASE)
        i = 0
        for pattern in STRESS_PATTERNS:
            for gate in ("qwen", "extreme"):
                i += 1
                for backend, f in (("qla", 1.0), ("fla", 1.02), ("flash_qla", 0.98)):
                    errs: dict[str, float | None] = {t: _STRESS_BASE[t] * f * (1 + 0.01 * i) for t in tensors}
                    nonfinite = None
                    if backend == "fla" and phase == "bwd":
                        if gate == "extreme" and i % 4 == 2:
                            errs["dg"], nonfinite = None, {"dg": 37}
                        else:
                            errs["dg"] = 0.03 * i
                    if backend == "flash_qla" and phase == "fwd" and "pad" in pattern:
                        errs["o"] = 0.8
                    add(phase, 2, 16, pattern, backend, errs, nonfinite, gate_profile=gate)
        for backend in ("qla", "fla", "flash_qla"):
            errs = {t: _STRESS_BASE[t] * 1.1 for t in tensors}
            add(phase, 2, 16, "1x8192", backend, errs, gate_profile="qwen", beta_profile="near1")
            add(phase, 2, 16, "512*1", backend, errs, gate_profile="bench", h0_scale=100.0)
    for gate in ("bench", "qwen"):
        for k, T in enumerate(DRIFT_LENGTHS):
            for backend, growth in (("qla", 1.0), ("fla", 1.0), ("flash_qla", 1.6)):
                errs = {t: _STRESS_BASE[t] * growth**k for t in ("o", "final_state")}
                add("fwd", 2, 8, f"1x{T}", backend, errs, gate_profile=gate)
    doc = make_results(rows, gpu_name=gpu_name)
    doc["run"].update(sweep="stress", tolerance=tolerance, gate_profile="qwen,extreme,bench")
    return doc
