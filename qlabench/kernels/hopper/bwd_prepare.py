"""bwd_prepare: the state-independent per-chunk pieces of the backward, one block per (chunk, qk-head).

Formula per chunk (gam = in-chunk cumsum of g clamped to the last real token, A = gate-free A_k,
Gam[i, j] = exp(gam_i - gam_j) for j <= i else 0):

    Pg  = scale Gam .* Q K^T            (C x C, bf16 out, rows t0 .. end - 1)
    Ag  = Gam .* A .* beta_col          (C x C, bf16 out, rows t0 .. end - 1)
    fac = [e; r; beta]                  (3 x C fp32 out per chunk row: e = exp(gam),
                                         r = exp(gam_C - gam), beta zero past the sequence end;
                                         e[C - 1] = exp(gam_C) since gam is clamped)

Pg and Ag are the bf16 masks of the serial reverse pass (bwd_dh), formed here for every chunk in
parallel and off its serial loop; fac lets the two chunk recurrences (bwd_h, bwd_dh) read their
per-row factors with one TMA tile instead of exponentials and strided gate loads.
Variants (``masks``, compile-time): "pg_ag" forms both (the low-level backward, or bwd_masks=recompute);
after the API's own forward its kkt_solve already wrote Ag and (unless the BV-128 recurrence formed it on
chip) Pm = Pg, kept for the backward (forward.KktMasks, KernelOptions.bwd_masks = forward), so "pg" forms
Pg and the factors only (no A load, no Ag), and "none" the factors only, by a separate small kernel (one
block per chunk over every v-head, `_factors_kernel`: the gate loads and three exponentials per row). Same
arguments in every variant; the outputs a variant does not form are never written.
Rows past the chunk end (the next sequence, or the padding tail) are loaded unmasked but never
stored; inside the stored rows the columns past the end are cut by the causal select j <= i
(a select, so non-finite data there cannot leak in).

Grid: (NCmax chunks, H_qk), one block per (chunk, qk-head) looping over the qk-head's GQA group of v-heads;
unused chunk-table rows (start == end) do nothing. Threads: 256 (two warpgroups split the GEMM's N and the
elementwise work).
Loads: Q, K as TMA boxes of C rows once per block (mbarrier ld[0]); A of the group's first v-head on ld[1]
with them, each later v-head's A issued once every thread is past the previous one's A, Pg, Ag tiles
(ld[1]'s phase j is v-head j's A); gam, beta element-wise while the boxes fly.
GEMMs per block (wgmma, smem operands, fp32 accumulate): Q K^T 64x64x128 once; its fp32 fragment stays in
registers over the group (Pg of each v-head is masked on a copy). The kernel is bound by memory traffic
(H200: ~3.2-3.6 TB/s at 1x32768): per v-head one block used to load Q, K (32 KB) for 24 KB of A, Pg, Ag,
so under GQA the group's v-heads re-read the same Q, K rows.
H200, session 16 (results/h200/2026-12-02_s16/bwd-ab-*.log, in the API's backward, us, one block per (chunk,
v-head) with T.copy loads -> this kernel): hk16_hv64 1x32768 528 -> 427, hk2_hv8 1x32768 71 -> 50, hk16_hv16
1x32768 144 -> 141; Pg, Ag, fac unchanged (same gradients' errors).
Shared memory (bf16): Q, K 2 x 16 KB, A, Pg, Ag 3 x 8 KB, gam/beta 0.5 KB: ~57 KB. The launch bounds ask for three
blocks per SM (72 registers; ptxas took 89 without them: two blocks). H200, session 17 (occ-ab.log, us, two ->
three blocks): hk16_hv64 1x32768 431 -> 421, 8192x4 431 -> 420, hk16_hv16 140 -> 140, hk2_hv8 8192x4 50 -> 53:
about neutral (the kernel is bound by its memory traffic).
Pg and Ag are formed on fp32 fragments and copied to their (swizzled) shared tiles whole, by stmatrix,
as kkt_solve's Pm and Ag are (session 13: the element-wise bf16 stores from the fragment layout put eight
rows of one column in one shared-memory bank): 157 -> 145 us at hk16_hv16 1x32768, 599 -> 527 at
hk16_hv64 (H200, in the API's backward).
scale is a runtime argument (one compiled kernel serves every scale).
Emulated by ``qlabench.kernels.emulate_bwd.twin_bwd_prepare`` (masks: ``_emu_masks``).
The gate rows (load_gates) and the masking / store step (store_masks) are common/bwd_prepare.py's macros,
shared with blackwell/bwd_prepare.py (which keeps one block per (chunk, v-head) and common's element-wise
load_chunk).
"""

import functools

import tilelang.language as T

from ..common.bwd_prepare import load_gates, store_masks, store_pg
from ..common.smem_layout import swizzled
from .bwd_common import compile_bwd

THREADS = 256


MASKS = ("pg_ag", "pg", "none")  # the masks a variant forms (fac always): both, Pg only, neither


@functools.cache
def bwd_prepare_kernel(h_qk: int, h_v: int, K: int, C: int, dtype: str, arch: str, masks: str = "pg_ag"):
    """``masks``: which of Pg, Ag the kernel forms and stores (MASKS; fac always). The API's backward after
    its own forward takes the forward's kkt_solve masks (Ag always, Pm = Pg unless the BV-128 recurrence
    formed it on chip) and launches "none" or "pg": the arguments stay the same, the outputs it does not
    form are never written."""
    if masks not in MASKS:
        raise ValueError(f"masks must be one of {MASKS}, got {masks!r}")
    if masks == "none":
        return _factors_kernel(h_qk, h_v, C, dtype, arch)
    with_ag = masks == "pg_ag"
    group = h_v // h_qk
    n_tok = T.dynamic("n_tok")
    n_chunks = T.dynamic("n_chunks")

    @T.prim_func
    def bwd_prepare(
        q: T.Tensor((n_tok, h_qk, K), dtype),
        k: T.Tensor((n_tok, h_qk, K), dtype),
        g_cumsum: T.Tensor((n_tok, h_v), "float32"),
        beta: T.Tensor((n_tok, h_v), "float32"),
        A: T.Tensor((n_tok, h_v, C), dtype),
        chunk_bounds: T.Tensor((n_chunks, 2), "int32"),
        Pg_out: T.Tensor((n_tok, h_v, C), dtype),
        Ag_out: T.Tensor((n_tok, h_v, C), dtype),
        fac_out: T.Tensor((n_chunks, h_v, 3, C), "float32"),
        scale: T.float32,
    ):
        with T.Kernel(n_chunks, h_qk, threads=THREADS) as (c, hk):
            T.annotate_min_blocks_per_sm(3)  # 72 registers instead of 89 (two blocks); 57 KB of shared memory allow three
            Q_s = T.alloc_shared((C, K), dtype)
            K_s = T.alloc_shared((C, K), dtype)
            A_s = T.alloc_shared((C, C), dtype)
            Pg_s = T.alloc_shared((C, C), dtype)
            Ag_s = T.alloc_shared((C, C), dtype)
            gam_s = T.alloc_shared((C,), "float32")
            beta_s = T.alloc_shared((C,), "float32")
            P_f = T.alloc_fragment((C, C), "float32")  # Q K^T of the qk-head, kept over its group
            Pg_f = T.alloc_fragment((C, C), "float32")
            Ag_f = T.alloc_fragment((C, C), "float32")
            ld = T.alloc_barrier([THREADS, THREADS])  # ld[0]: Q, K; ld[1]: A of the v-head (phase j)
            T.annotate_layout(swizzled(A_s, Pg_s, Ag_s))  # read and written in the fragment layout

            t0 = chunk_bounds[c, 0]
            end = chunk_bounds[c, 1]

            if t0 < end:
                T.tma_copy(q[t0:t0 + C, hk, :], Q_s, barrier=ld[0])
                T.tma_copy(k[t0:t0 + C, hk, :], K_s, barrier=ld[0])
                if with_ag:
                    T.tma_copy(A[t0:t0 + C, hk * group, :], A_s, barrier=ld[1])
                T.mbarrier_arrive(ld[0])
                if with_ag:
                    T.mbarrier_arrive(ld[1])
                T.mbarrier_wait_parity(ld[0], 0)
                T.gemm(Q_s, K_s, P_f, transpose_B=True, clear_accum=True)
                for j in T.serial(group):
                    hv = hk * group + j
                    load_gates(g_cumsum, beta, gam_s, beta_s, t0, end, hv, C)
                    T.copy(P_f, Pg_f)
                    if with_ag:
                        T.mbarrier_wait_parity(ld[1], j & 1)
                    T.sync_threads()  # gam_s, beta_s of every thread
                    if with_ag:
                        store_masks(Pg_f, Ag_f, A_s, gam_s, beta_s, Pg_s, Ag_s, Pg_out, Ag_out, fac_out, scale, c,
                                    t0, end, hv, C, dtype)
                    else:
                        store_pg(Pg_f, gam_s, beta_s, Pg_s, Pg_out, fac_out, scale, c, t0, end, hv, C)
                    T.fence_proxy_async()  # this thread's reads of A_s before the next box overwrites it
                    T.sync_threads()  # every thread past the v-head's A_s, Pg_s, Ag_s, gam_s, beta_s
                    if with_ag and j + 1 < group:
                        T.tma_copy(A[t0:t0 + C, hv + 1, :], A_s, barrier=ld[1])
                        T.mbarrier_arrive(ld[1])

    return compile_bwd(bwd_prepare, arch)


# "none"'s block: threads of the factors kernel (one block per chunk, every v-head)
FACTOR_THREADS = 256


@functools.cache
def _factors_kernel(h_qk: int, h_v: int, C: int, dtype: str, arch: str):
    """bwd_prepare with masks "none": fac only, one block of FACTOR_THREADS per chunk over all H_v v-heads (the
    arguments of the full kernel; q, k, A, Pg_out, Ag_out are never touched). The gates g_cumsum[t, h] and
    beta[t, h] are read along h, the token rows' contiguous axis, into a C x (H_v + 1) staging tile (the padding
    column keeps the column-wise reads below conflict-free), and each v-head's factor rows are stored along the
    chunk, their contiguous axis. Shared memory: 2 x C x (H_v + 1) x 4 bytes (33 KB at H_v = 64). (Until session
    46 one block of C threads per (chunk, v-head) read one gate per 32-byte sector: H100, h200-bwd, 2.1-8.7 us
    per backward, 20 us at hk16_hv32 32k; this kernel 0.999x the backward's time, hk16_hv32 0.9955x,
    results/h200/2026-12-06_s46/.)"""
    n_tok = T.dynamic("n_tok")
    n_chunks = T.dynamic("n_chunks")
    K = 128

    @T.prim_func
    def bwd_factors(
        q: T.Tensor((n_tok, h_qk, K), dtype),
        k: T.Tensor((n_tok, h_qk, K), dtype),
        g_cumsum: T.Tensor((n_tok, h_v), "float32"),
        beta: T.Tensor((n_tok, h_v), "float32"),
        A: T.Tensor((n_tok, h_v, C), dtype),
        chunk_bounds: T.Tensor((n_chunks, 2), "int32"),
        Pg_out: T.Tensor((n_tok, h_v, C), dtype),
        Ag_out: T.Tensor((n_tok, h_v, C), dtype),
        fac_out: T.Tensor((n_chunks, h_v, 3, C), "float32"),
        scale: T.float32,
    ):
        with T.Kernel(n_chunks, threads=FACTOR_THREADS) as c:
            gam_s = T.alloc_shared((C, h_v + 1), "float32")
            beta_s = T.alloc_shared((C, h_v + 1), "float32")
            t0 = chunk_bounds[c, 0]
            end = chunk_bounds[c, 1]
            if t0 < end:
                for i, hv in T.Parallel(C, h_v):  # gam clamped to the last real row, beta zero past the end
                    gam_s[i, hv] = g_cumsum[T.min(t0 + i, end - 1), hv]
                    beta_s[i, hv] = T.if_then_else(t0 + i < end, beta[t0 + i, hv], 0.0)
                T.sync_threads()
                for hv, i in T.Parallel(h_v, C):  # store_factors' values, row by row of each v-head
                    fac_out[c, hv, 0, i] = T.exp(gam_s[i, hv])
                    fac_out[c, hv, 1, i] = T.exp(gam_s[C - 1, hv] - gam_s[i, hv])
                    fac_out[c, hv, 2, i] = beta_s[i, hv]

    return compile_bwd(bwd_factors, arch)
