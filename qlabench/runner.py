"""Executes a sweep: per case, seeded inputs and one float64 reference, then every backend's first
call, correctness check and timing; each finished row is saved at once (atomic replace).

Order: cases come grouped per head preset (config.build_cases), so a backend compiles a head
configuration once and reuses it over all of that preset's patterns. Inside a case the backends run
one after another on the same input buffers.

Per backend and case:
    available, and implements the case's phase? ── no ──> row `unavailable` (reason in message)
    first call (timed apart: compilation, autotuning)  -> outputs checked against the reference
    peak memory of one call, then timing (timing.measure)
    [CUDA, backends that verify their path] one profiled call -> kernel names -> check_kernels
    status: ok | incorrect (error over tolerance, still timed) | error (exception, OOM; sweep goes on)
"""

from __future__ import annotations

import contextlib
import gc
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from . import results as R
from .backends import GRAD_NAMES, Backend
from .check import DEFAULT_TOLERANCE, compare
from .config import Case
from .envinfo import clocks, utc_now
from .kernels.reference import chunk_gated_delta_rule_ref
from .timing import (
    DEFAULT_REPEATS,
    DEFAULT_WARMUP,
    bench_stream,
    first_call,
    kernel_split,
    measure,
    on_stream,
    peak_memory_mb,
)
from .workload import Workload, case_seed, make_workload, scale_pattern

CPU_QUICK_MAX_TOKENS = 512
CPU_NOTICE = "CPU reference timings (not GPU kernel figures)"
QUICK_WARMUP = {"cuda": 3, "cpu": 1}
QUICK_REPEATS = {"cuda": 20, "cpu": 5}
VERIFY_MODES = ("first", "each", "off")


@dataclass
class RunConfig:
    """How to run: device, timer settings, correctness tolerance, quick mode, base seed."""

    device: str = "cuda"
    timer: str = "auto"
    l2: str = "auto"
    warmup: int = DEFAULT_WARMUP
    repeats: int = DEFAULT_REPEATS
    tolerance: float = DEFAULT_TOLERANCE
    quick: bool = False
    seed: int = 0
    head_dim: int = 128
    cpu_max_tokens: int = CPU_QUICK_MAX_TOKENS
    # profile a backend that checks its kernel path (fla): on the first case of each (phase, preset)
    # ("first": FLA's dispatch depends on the head configuration and phase, not on seqlens), on every
    # case ("each"), or never ("off")
    verify_kernels: str = "first"
    with_h0: bool = True
    # `run --kernel-split`: profile a few calls of every timed row, per-kernel time in row["kernel_split"]
    kernel_split: bool = False
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', got {self.device!r}")
        check_tolerance(self.tolerance)
        if self.verify_kernels not in VERIFY_MODES:
            raise ValueError(f"verify_kernels must be one of {VERIFY_MODES}, got {self.verify_kernels!r}")


def check_tolerance(tolerance) -> float:
    """The largest relative L2 error a correct row may have: a finite number in (0, 1). Infinity would
    pass every row, NaN fail every row, and 1 or more pass an all-zero output."""
    if not (isinstance(tolerance, (int, float)) and not isinstance(tolerance, bool)
            and 0 < tolerance < 1):
        raise ValueError(f"--tolerance must be a finite number in (0, 1), got {tolerance!r}")
    return float(tolerance)


def _short(e: BaseException, limit: int = 600) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        torch.cuda.empty_cache()


# --- reference -------------------------------------------------------------------------------------


def _as_float64(w: Workload) -> Workload:
    f = {n: getattr(w, n).to(torch.float64) for n in ("q", "k", "v", "g", "beta")}
    if w.h0 is not None:
        f["h0"] = w.h0.to(torch.float64)
    return replace(w, **f)


def reference_outputs(phase: str, w: Workload) -> dict[str, torch.Tensor]:
    """The float64 oracle on the case's device: o, final_state (+ the six gradients for bwd/fwdbwd)."""

    def fwd(x: Workload):
        return chunk_gated_delta_rule_ref(x.q, x.k, x.v, x.g, x.beta, scale=x.scale, initial_state=x.h0,
                                          output_final_state=True, cu_seqlens=x.cu_seqlens)

    w64 = _as_float64(w)
    if phase == "fwd":
        with torch.no_grad():
            o, ht = fwd(w64)
        return {"o": o, "final_state": ht}
    wd, leaves = w64.differentiable()
    o, ht = fwd(wd)
    grads = torch.autograd.grad((o, ht), leaves, (w.do.to(torch.float64), w.dht.to(torch.float64)))
    out = {"o": o.detach(), "final_state": ht.detach()}
    out.update(zip(GRAD_NAMES, grads))
    return out


# --- one backend on one case -----------------------------------------------------------------------


class _PhaseCall:
    """What is timed for a phase, and how its raw result maps to named outputs."""

    def __init__(self, phase: str, backend: Backend, w: Workload):
        self.phase, self.backend, self.w = phase, backend, w
        self.wd = self.outs = self.leaves = self.grad_out = None

    def prepare(self) -> None:
        """Leaves requiring grad (bwd, fwdbwd) and, for bwd, the forward that the timed backward
        differentiates: both outside the timed region."""
        if self.phase == "fwd":
            return
        self.wd, self.leaves = self.w.differentiable()
        if self.phase == "bwd":
            self.outs = self.backend.forward(self.wd)
            self.grad_out = self._grad_outputs(self.outs)

    def release(self) -> None:
        self.wd = self.outs = self.leaves = self.grad_out = None

    def _grad_outputs(self, outs):
        o, ht = outs
        return self.w.do.to(o.dtype), self.w.dht.to(ht.dtype)

    def __call__(self):
        if self.phase == "fwd":
            with torch.no_grad():
                return self.backend.forward(self.w)
        if self.phase == "bwd":
            return self.outs, torch.autograd.grad(self.outs, self.leaves, self.grad_out, retain_graph=True,
                                                  allow_unused=True)
        outs = self.backend.forward(self.wd)
        return outs, torch.autograd.grad(outs, self.leaves, self._grad_outputs(outs), allow_unused=True)

    def named(self, raw) -> dict:
        if self.phase == "fwd":
            o, ht = raw
            return {"o": o, "final_state": ht}
        (o, ht), grads = raw
        out = {"o": o, "final_state": ht}
        out.update(zip(GRAD_NAMES, grads))
        return out


def _kernel_names(call, device: str) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(set(names))


def run_backend_case(case: Case, w: Workload, ref: dict, backend: Backend, cfg: RunConfig,
                     base_row: dict, verify: bool | None = None) -> dict:
    """Measures one backend on one case; always returns a row (exceptions become `error` rows)."""
    row = R.make_row(status="error", **base_row, backend=backend.name, options=backend.options_record(),
                     timestamp=utc_now())
    with contextlib.suppress(Exception):
        row["backend_version"] = backend.version()
    stream = bench_stream(cfg.device)
    call = _PhaseCall(case.phase, backend, w)
    try:
        with on_stream(stream):

            def first():
                call.prepare()
                return call()

            row["first_call_s"], raw = first_call(first, cfg.device)
            verdict = compare(call.named(raw), ref, cfg.tolerance)
            del raw
            row["errors"] = verdict.errors
            row["nonfinite"] = verdict.nonfinite  # tensor -> NaN/Inf elements, where any
            row["peak_mem_mb"] = peak_memory_mb(call, cfg.device)
            timing = measure(call, cfg.device, timer=cfg.timer, warmup=cfg.warmup, repeats=cfg.repeats,
                             l2=cfg.l2)
            row.update(timing.stats())
            row.update(timer=timing.timer, l2_policy=timing.l2_policy,
                       calls_per_sample=timing.calls_per_sample)
            notes = [m for m in (verdict.message(), timing.note) if m]
            status = "ok" if verdict.ok else "incorrect"
            if cfg.kernel_split:
                try:
                    row["kernel_split"] = kernel_split(call, cfg.device)
                except Exception as e:  # noqa: BLE001 - the timing stands; the split is extra
                    notes.append(f"kernel split failed: {_short(e)}")
            if verify is None:
                verify = cfg.verify_kernels != "off"
            if cfg.device == "cuda" and verify and type(backend).check_kernels is not Backend.check_kernels:
                names = _kernel_names(call, cfg.device)
                row["kernels"] = names[:60]
                path_ok, why = backend.check_kernels(case.phase, names)
                if not path_ok:
                    status = "error"
                    notes.insert(0, f"wrong kernel path: {why}")
            row["status"] = status
            row["message"] = "; ".join(notes)
    except Exception as e:  # noqa: BLE001 - any failure (compile error, OOM) becomes an error row
        for k in R.TIME_FIELDS + ("samples",):
            row[k] = None
        row["status"] = "error"
        row["message"] = _short(e)
    finally:
        call.release()
        _free(cfg.device)
    return row


# --- the sweep -------------------------------------------------------------------------------------


def base_row(case: Case, seqlens, cfg: RunConfig) -> dict:
    return {
        "phase": case.phase, "preset": case.preset.name, "model": case.preset.model,
        "h_qk": case.preset.h_qk, "h_v": case.preset.h_v, "pattern": case.pattern.name,
        "seqlens": list(seqlens), "total_tokens": int(sum(seqlens)), "n_seqs": len(seqlens),
        "gate_profile": case.gate_profile, "dtype": case.dtype, "head_dim": cfg.head_dim,
        # the input recipe beyond the gate, and the padding tail actually run (qlabench/workload.py)
        "beta_profile": case.beta_profile, "h0_scale": case.h0_scale,
        "pad_tokens": case_pattern(case, cfg).pad,
    }


def case_pattern(case: Case, cfg: RunConfig):
    """The pattern actually run: scaled to cpu_max_tokens for --quick on the CPU."""
    if cfg.quick and cfg.device == "cpu":
        return scale_pattern(case.pattern, cfg.cpu_max_tokens)
    return case.pattern


def availability(backends: list[Backend], device: str) -> dict[str, tuple[bool, str]]:
    out = {}
    for b in backends:
        try:
            out[b.name] = b.available(device)
        except Exception as e:  # noqa: BLE001 - a broken availability probe is a reason, not a crash
            out[b.name] = (False, f"available() raised {_short(e)}")
    return out


class Runner:
    """Runs cases over backends into ``results`` (a dict from results.new_results), saving to ``out``.

    ``row_fields`` are set on every row (the GPU it ran on: gpu_index, gpu_uuid; a shard's worker).
    """

    def __init__(self, cfg: RunConfig, backends: list[Backend], results: dict, out: Path | None,
                 progress: bool = True, echo=print, row_fields: dict | None = None):
        self.cfg, self.backends, self.results, self.out = cfg, backends, results, out
        self.progress, self.echo = progress, echo
        self.row_fields = dict(row_fields or {})
        self.done = {R.row_key(r) for r in results["rows"] if r["status"] in ("ok", "incorrect")}
        self.avail = availability(backends, cfg.device)
        self.verified: set[tuple] = set()  # (backend, phase, preset) whose kernel path was checked

    def _save(self) -> None:
        if self.out is not None:
            R.save(self.results, self.out)

    def _add(self, row: dict) -> None:
        row.update(self.row_fields)
        R.upsert_row(self.results, row)
        self._save()

    def run(self, cases: list[Case]) -> dict:
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=len(cases), unit="case", file=sys.stderr, dynamic_ncols=True)
        try:
            for case in cases:
                if bar is not None:
                    bar.set_postfix_str(case.label, refresh=False)
                self.run_case(case)
                if bar is not None:
                    bar.update(1)
        except KeyboardInterrupt:
            self.finish()
            raise
        finally:
            if bar is not None:
                bar.close()
        self.finish()
        return self.results

    def finish(self) -> None:
        if self.cfg.device == "cuda":
            self.results["env"]["clocks_end"] = clocks()
        self._save()

    def run_case(self, case: Case) -> None:
        cfg = self.cfg
        pattern = case_pattern(case, cfg)
        base = base_row(case, pattern.seqlens, cfg)
        scaled = pattern.seqlens != case.pattern.seqlens
        note = (f"quick: scaled to {pattern.total_tokens} tokens from {case.pattern.total_tokens}"
                if scaled else "")
        pending = [b for b in self.backends
                   if R.row_key({**base, "backend": b.name}) not in self.done]
        runnable = []
        for b in pending:
            ok, why = self.avail[b.name]
            if ok:
                ok, why = b.supports(case.phase)  # a forward-only library has no bwd rows
            if ok:
                runnable.append(b)
            else:
                self._add(R.make_row(status="unavailable", **base, backend=b.name, message=why,
                                     options=b.options_record(), timestamp=utc_now()))
        if not runnable:
            return
        try:
            w = make_workload(case.preset.h_qk, case.preset.h_v, pattern.seqlens, case.gate_profile,
                              seed=case_seed(cfg.seed, case.preset.name, case.pattern.name, case.gate_profile),
                              device=cfg.device, head_dim=cfg.head_dim, with_h0=cfg.with_h0,
                              beta_profile=case.beta_profile, h0_scale=case.h0_scale, pad=pattern.pad,
                              dtype=getattr(torch, case.dtype))
            ref = reference_outputs(case.phase, w)
        except Exception as e:  # noqa: BLE001 - the case fails, the sweep goes on
            for b in runnable:
                self._add(R.make_row(status="error", **base, backend=b.name, timestamp=utc_now(),
                                     options=b.options_record(),
                                     message=f"inputs/reference failed: {_short(e)}"))
            _free(cfg.device)
            return
        for b in runnable:
            group = (b.name, case.phase, case.preset.name)
            verify = cfg.verify_kernels == "each" or (cfg.verify_kernels == "first" and group not in self.verified)
            row = run_backend_case(case, w, ref, b, cfg, base, verify=verify)
            if "kernels" in row and row["status"] != "error":
                self.verified.add(group)
            if note:
                row["message"] = "; ".join(m for m in (note, row["message"]) if m)
            self._add(row)
        del w, ref
        _free(cfg.device)
