"""Ahead-of-time compilation: every kernel the API would launch for a head configuration, compiled
for an architecture's explicit target into the TileLang cache, without a GPU.

The kernel files come from `dispatch.kernel_factory` (the same choice the API makes): sm100's forward
and backward are blackwell/ (tcgen05 MMAs into tensor memory); sm120's forward is the Hopper files
for sm_120a at C = 32 (mma.sync), checked against its 99 KB of shared memory per block
(blackwell_sm120/); sm120 has no backward, and `not_available` says so.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from .dispatch import arch_by_name, has_kernel, kernel_factory

HEAD_DIM = 128
VALUE_TILES = (32, 64)


@dataclass
class Compiled:
    kernel: str
    config: str
    seconds: float
    cached: bool = False  # no new entry in the TileLang cache: loaded from disk (or this process's memory)


def cache_dir() -> Path:
    """The TileLang cache directory this process writes to ($TILELANG_CACHE_DIR or TileLang's default)."""
    if os.environ.get("TILELANG_CACHE_DIR"):
        return Path(os.environ["TILELANG_CACHE_DIR"])
    from tilelang import env

    return Path(env.TILELANG_CACHE_DIR)


def cache_entries(root: Path) -> set[str]:
    """The compiled kernels in a TileLang cache (<version>/<kind>/<hash> folders; staging ones left out)."""
    if not root.is_dir():
        return set()
    return {"/".join(p.relative_to(root).parts) for p in root.glob("*/*/*")
            if p.is_dir() and not any(part.startswith(".") for part in p.relative_to(root).parts)}


def forward_kernels(h_qk: int, h_v: int, arch: str, dtype: str = "bfloat16",
                    state_layouts=(False, True)) -> list[tuple[str, str, object]]:
    """(name, config text, thunk) for every forward kernel of one head configuration."""
    from .common.cp_correct import BV_CORRECT, cp_correct_kernel, split_hi_lo_kernel
    from .common.cp_tables import cp_tables_kernel
    from .common.cumsum import chunk_local_cumsum_kernel

    a = arch_by_name(arch)
    C = a.chunk_size
    kkt_solve_kernel = kernel_factory(a, "kkt_solve")
    jobs = [
        ("chunk_local_cumsum", f"H={h_v} C={C}", lambda: chunk_local_cumsum_kernel(h_v, C, False, a.name)),
        ("kkt_solve", f"hk{h_qk}_hv{h_v} {dtype}", lambda: kkt_solve_kernel(h_qk, h_v, HEAD_DIM, C, dtype, a.name)),
        # without A: a forward no backward follows (forward.solve_chunks)
        ("kkt_solve", f"hk{h_qk}_hv{h_v} {dtype} no A",
         lambda: kkt_solve_kernel(h_qk, h_v, HEAD_DIM, C, dtype, a.name, False)),
        # without Pm (with and without A): chunk_fwd_v128 forms it on chip (forward.forms_pm)
        *([("kkt_solve", f"hk{h_qk}_hv{h_v} {dtype}{a_txt} no Pm",
            lambda store_a=store_a: kkt_solve_kernel(h_qk, h_v, HEAD_DIM, C, dtype, a.name, store_a, False))
           for store_a, a_txt in ((True, ""), (False, " no A"))] if has_kernel(a, "chunk_fwd_v128") else []),
        # the CP correction chain (forward and backward CP) and the CP forward's warm-up tables
        # M as stored, and read transposed (the backward's chain on the forward's transitions, the forward's
        # with the transposed state layout)
        *[("cp_correct", f"H={h_v} BV={BV_CORRECT}{' M^T' if tm else ''}",
           lambda tm=tm: cp_correct_kernel(h_v, HEAD_DIM, HEAD_DIM, BV_CORRECT, a.name, tm)) for tm in (False, True)],
        ("cp_tables", f"H={h_v}", lambda: cp_tables_kernel(h_v, a.name)),
        ("split_hi_lo", f"K={HEAD_DIM}", lambda: split_hi_lo_kernel(HEAD_DIM, a.name)),
    ]
    # the A/B recurrences and, where the arch has them, the warp-specialized ones (sm90's defaults: ws
    # at BV 32, wy at BV 64)
    recurrence_roles = [r for r in ("chunk_fwd", "chunk_fwd_pipelined", "chunk_fwd_ws", "chunk_fwd_wy")
                        if has_kernel(a, r)]
    for vf in state_layouts:
        for bv in VALUE_TILES:
            for name in recurrence_roles:
                factory = kernel_factory(a, name)
                jobs.append((
                    name, f"hk{h_qk}_hv{h_v} {dtype} BV={bv} {'vk' if vf else 'kv'}",
                    lambda vf=vf, bv=bv, factory=factory: factory(h_qk, h_v, HEAD_DIM, HEAD_DIM, bv, C, dtype, vf,
                                                                  a.name),
                ))
        if has_kernel(a, "chunk_fwd_v128"):  # sm90's recurrence at V tile 128 (forward.forward_value_tile)
            factory = kernel_factory(a, "chunk_fwd_v128")
            jobs.append((
                "chunk_fwd_v128", f"hk{h_qk}_hv{h_v} {dtype} BV=128 {'vk' if vf else 'kv'}",
                lambda vf=vf, factory=factory: factory(h_qk, h_v, HEAD_DIM, HEAD_DIM, HEAD_DIM, C, dtype, vf, a.name),
            ))
    return jobs


def not_available(arch: str, backward: bool = True) -> list[str]:
    """One line per kernel group that ``arch`` does not have (compile_all skips them)."""
    a = arch_by_name(arch)
    if backward and not a.has_backward:
        return [f"backward: not available for {a.name} (forward only; the API raises NotImplementedError)"]
    return []


def backward_kernels(h_qk: int, h_v: int, arch: str, dtype: str = "bfloat16") -> list[tuple[str, str, object]]:
    """(name, config text, thunk) for the backward kernels, when the architecture has them."""
    a = arch_by_name(arch)
    if not a.has_backward:
        return []
    try:
        from .backward import compile_backward_kernels, fused_fits, prepare_variants, value_tiles
    except ImportError:
        return []
    from .common.cp_rows import dht_rows_kernel
    from .common.cumsum import chunk_local_cumsum_kernel

    jobs = [("chunk_local_cumsum_reverse", f"H={h_v} C={a.chunk_size}",
             lambda: chunk_local_cumsum_kernel(h_v, a.chunk_size, True, a.name)),
            # the CP backward's piece terminal-gradient rows (backward_cp._reverse_passes)
            ("cp_dht_rows", f"H={h_v}", lambda: dht_rows_kernel(h_v, HEAD_DIM, HEAD_DIM, a.name))]
    # one kernel set serves both state layouts (the host transposes the per-sequence states); the
    # variants follow the heads as in the API (backward._kernels: bwd_chunk/bwd_intra's dq, dk in dtype when
    # h_v == h_qk, fp32 with GQA). The API picks the V tile of bwd_h / bwd_dh from its grid
    # (backward._value_tile: 32 or 64 on sm90, 64 on sm100), so every tile the arch may take is
    # compiled; the other three kernels do not depend on it (compiled once, cached in-process).
    for bv in value_tiles(a.name):
        jobs.append(("backward kernels", f"hk{h_qk}_hv{h_v} {dtype} BV={bv}",
                     lambda bv=bv: compile_backward_kernels(h_qk, h_v, dtype=dtype, target=a.name, bv=bv)))
    # after the API's own forward bwd_prepare forms only the masks kkt_solve did not (backward._prepare_masks)
    for masks in prepare_variants(a.name):
        jobs.append(("bwd_prepare", f"hk{h_qk}_hv{h_v} {dtype} masks={masks}",
                     lambda masks=masks: compile_backward_kernels(h_qk, h_v, dtype=dtype, target=a.name,
                                                                  prepare=masks)["bwd_prepare"]))
    # bwd_dh=auto's fused kernel for CP backwards of few chains (backward.cp_dh_choice): H_v == H_qk, sm90
    if fused_fits(a, h_qk, h_v):
        jobs.append(("bwd_fused", f"hk{h_qk}_hv{h_v} {dtype}",
                     lambda: compile_backward_kernels(h_qk, h_v, dtype=dtype, target=a.name,
                                                      bwd_dh="fused")["bwd_fused"]))
    return jobs


def compile_all(heads: list[tuple[int, int]], arch: str, dtypes=("bfloat16",), state_layouts=(False, True),
                backward: bool = True, on_done=None) -> list[Compiled]:
    """Compiles every kernel for each (h_qk, h_v); calls ``on_done(Compiled)`` as each finishes.

    A job that adds no entry to the TileLang cache is reported ``cached`` (a load, not a compile)."""
    done = []
    seen = set()
    root = cache_dir()
    entries = cache_entries(root)
    for h_qk, h_v in heads:
        for dtype in dtypes:
            jobs = forward_kernels(h_qk, h_v, arch, dtype, state_layouts)
            if backward:
                jobs += backward_kernels(h_qk, h_v, arch, dtype)
            for name, config, thunk in jobs:
                if (name, config) in seen:
                    continue
                seen.add((name, config))
                t0 = time.perf_counter()
                thunk()
                seconds = time.perf_counter() - t0
                now = cache_entries(root)
                item = Compiled(name, config, seconds, cached=not (now - entries))
                entries = now
                done.append(item)
                if on_done:
                    on_done(item)
    return done
