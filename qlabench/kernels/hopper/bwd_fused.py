"""bwd_fused: bwd_chunk's per-chunk gradients with the state gradient dS carried on chip, one block per (chain, v-head)
walking its chunks from the last to the first (Hopper, sm_90a). The API takes it on CP backwards of few chains with
H_v == H_qk (backward.cp_dh_choice; KernelOptions.bwd_dh = fused forces it), bwd_chunk elsewhere.

Why (results/h200/NOTES.md, session 27's view, item 4): the dh pass stores dh (K x V bf16) and dV' for every
(chunk, v-head) and bwd_chunk reads them back, ~96 KB per item that this kernel does not move; and dh is the buffer
that keeps the hk16_hv16 rows' peak memory over 1.25x flash-qla's (256 MiB at 1x32768).

Formula per chunk (bwd_chunk.py's header, with dS and dV' formed here instead of loaded; Pg = scale Gam .* P,
P = Q K^T, r = exp(gam_C - gam) (0 past the chunk's end), e_C = exp(gam_C), eDO = scale diag(e) dO):

    dV' = diag(r) K dS + Pg^T dO          (fp32, then bf16: bwd_dh_ws's rounding points)
    ... every gradient of bwd_chunk.py from S0 = h[c], dS, dV' ...
    dS  <- e_C dS + K^T dU + Q^T eDO      (dU = -diag(e) Ag^T dV', bf16, as bwd_chunk forms it)
    after the chain's first chunk: dh0 = dS (fp32)

The dS chain is separable by V columns: column half j of dV', dv, dU and of the next dS reads only column half j
of dS and dO. bwd_chunk already forms U, dv, dU, W and V' on column halves, one per warpgroup, so here each
warpgroup also owns its half of dS in registers (K x V / 2 fp32: 64 per thread) and runs its half of the chain;
no third warpgroup, no hand-off of the state.

Grid: (H_v, n_chains), one block per (v-head, chain); chain_bounds[j] = (bos, eos, cbase, n): the chain's token
range (chunk-aligned bos), the row of h holding its first chunk's start state, and its row n of dht (the gradient at
the chain's end, fp32 [K, V]) and of dh0 (the gradient at its start). The table's order is the dispatch order, v-heads
fastest: the host lists the chains longest first (CPPlan.fused_chains), so with one block per SM the long walks start
first and the short ones fill in behind them (a greedy schedule of the bench's 32k_2seq / 4seq / 8seq pieces ends
after 64 chunk steps instead of 79-80 in token order). GQA (H_v > H_qk) is not supported yet: per-v-head
dq / dk would need a group reduction. Threads: 256 (two warpgroups, as bwd_chunk).

Per chunk, each warpgroup w (named barriers at 256 threads between steps, as bwd_chunk):
  * BAR_TOP (both done with the previous chunk); warpgroup 0 issues the chunk's TMA loads: ld[0] = Q, K, S0;
    ld[1] = V, A, dO; each writes bf16(dS half) into dS_s and its half of gam, beta into gam_s, beta_s (from
    registers loaded at the previous chunk's top; the chain's first, possibly partial, chunk loads them there) and
    issues the loads of the next chunk's half; a partial chunk's rows past the end are zeroed by row halves;
    BAR_LOADED.
  * U = K S0, K dS and P = Q K^T on its halves (in flight together); Ag and Pg of its C x C columns (BAR_AG).
  * dV' = r .* K dS + Pg^T dO on its V columns -> dV'_s; then bwd_chunk's steps: dv = Ag^T dV' (stored), dU, W,
    V' = Ag W, dAb, dPg, X, Y, dA, dP, colsum(Y) (BAR_W, BAR_VP, BAR_MASKS).
  * The chain's end on its half: eDO -> dV'_s's columns (dV' is dead past BAR_MASKS), then dS = e_C dS + K^T dU +
    Q^T eDO (wgmma into the dS registers), in flight under the branch's work.
  * Warpgroup 0: dq and the WY-inverse terms and the dg / dbeta tail; warpgroup 1: dk (bwd_chunk's branches, the
    macros of bwd_chunk_steps.py, shared with bwd_chunk). dq, dk are staged at the chunk's end in tiles free until
    the next chunk's dU and V' (dU_s, V'_s) and stored at the next chunk's top, after its TMA issue, under its load
    wait; the chain's first chunk's after the walk.
Shared memory: bwd_chunk's 220 KB (no new tile: Pg lives in dP_s until dP is formed, eDO in dV'_s once dV' is dead).
Registers: bwd_chunk's + the dS half (64 per thread); the per-chunk dq / dk replace the group sums.
"""

import functools

import tilelang.language as T

from ..common.build import compile_for
from .bwd_chunk_steps import (
    BAR_AG,
    BAR_LOADED,
    BAR_LOCAL,
    BAR_TOP,
    BAR_VP,
    F_PAD,
    chunk_steps,
)


@functools.cache
def bwd_fused_kernel(h_qk: int, h_v: int, K: int, V: int, C: int, dtype: str, arch: str):
    assert K == V == 2 * C, "the halves below split K, V and C rows / columns evenly"
    if h_v != h_qk:
        raise ValueError(f"bwd_fused supports H_v == H_qk only (no GQA reduction yet), got {h_qk}, {h_v}")
    HV = V // 2
    HC = C // 2
    n_tok = T.dynamic("n_tok")
    n_chains = T.dynamic("n_chains")
    n_hc = T.dynamic("n_hc")
    steps = chunk_steps(C, K, V, dtype)

    @T.macro
    def chunk_part(w: int, lt, cr, ld, q, k, v, do, dv_out, A, h, g_cumsum, beta, Q_s, K_s, V_s, dO_s, dVp_s, dU_s,
                   Vp_s, A_s, Ag_s, S0_s, dS_s, dP_s, F_s, gam_s, beta_s, dgu_s, dbc_s, dS_f, U_f, kds_f, prod_f,
                   red_f, cc_f, dpg_f, p_f, x_f, gam_last: T.Ref, colsum: T.Ref, hc, t0, end, hv, scale, n_run,
                   g_next: T.Ref, b_next: T.Ref, eos, out, stage_s):
        """Warpgroup w's half of the chunk's shared steps and of the dS chain; first, the previous chunk's dq
        (warpgroup 0) or dk (1) rows, staged in ``stage_s`` at its end, out to ``out``."""
        T.fence_proxy_async()  # this thread's generic writes of the last chunk before the next TMA writes
        T.sync_threads(BAR_TOP, 256)
        if w == 0:
            T.tma_copy(q[t0:t0 + C, hv, :], Q_s, barrier=ld[0])
            T.tma_copy(k[t0:t0 + C, hv, :], K_s, barrier=ld[0])
            T.tma_copy(h[hc, hv, :, :], S0_s, barrier=ld[0])
            T.tma_copy(v[t0:t0 + C, hv, :], V_s, barrier=ld[1])
            T.tma_copy(A[t0:t0 + C, hv, :], A_s, barrier=ld[1])
            T.tma_copy(do[t0:t0 + C, hv, :], dO_s, barrier=ld[1])
            T.mbarrier_arrive(ld[0])
            T.mbarrier_arrive(ld[1])
        # this warpgroup's half of gam, beta: the chain's last chunk (the only partial one) loads its own; every other
        # chunk's were loaded into registers at the top of the chunk after it (the walk's previous), so no global
        # load latency is waited for here (measured 2-3 % of the backward at hk16_hv16 32k, session 30)
        if cr == 0:
            steps.load_scalars(w, g_cumsum, beta, gam_s, beta_s, t0, end, hv)
        elif lt < HC:
            gam_s[w * HC + lt] = g_next
            beta_s[w * HC + lt] = b_next
        if cr + 1 < n_run and lt < HC:  # the next (earlier, full) chunk's, first read at its top
            g_next = g_cumsum[t0 - C + w * HC + lt, hv]
            b_next = beta[t0 - C + w * HC + lt, hv]
        # the previous chunk's (the walk's; its rows start at t0 + C) dq or dk: stored here, after the TMA issue, so the
        # stores overlap this chunk's loads instead of delaying the chunk end (session 31: 0.981x alone, 0.967x with
        # bwd_chunk_steps.sv_sum, bwd_fused forced on hk16_hv16's h200-bwd rows)
        if cr > 0:
            steps.flush_rows(stage_s, out, t0 + C, T.min(eos, t0 + 2 * C), hv)
        T.copy(dS_f, dS_s[:, w * HV:(w + 1) * HV])  # bf16 of this half of the chunk-end gradient
        T.mbarrier_wait_parity(ld[0], cr & 1)
        T.mbarrier_wait_parity(ld[1], cr & 1)
        if end - t0 < C:  # a partial chunk (only a sequence's last): its rows past the end, this warpgroup's half
            for i, d in T.Parallel(HC, K):
                if t0 + w * HC + i >= end:
                    Q_s[w * HC + i, d] = T.cast(0, dtype)
                    K_s[w * HC + i, d] = T.cast(0, dtype)
                    V_s[w * HC + i, d] = T.cast(0, dtype)
                    dO_s[w * HC + i, d] = T.cast(0, dtype)
            for i, j in T.Parallel(HC, C):
                if t0 + w * HC + i >= end:
                    A_s[w * HC + i, j] = T.cast(0, dtype)
        T.fence_proxy_async()
        T.sync_threads(BAR_LOADED, 256)
        gam_last = gam_s[C - 1]
        # U = K S0, K dS on this half of the V columns, P = Q K^T on this half of the C columns: in flight together
        T.wgmma_gemm(K_s, S0_s[:, w * HV:(w + 1) * HV], U_f, clear_accum=True)
        T.wgmma_gemm(K_s, dS_s[:, w * HV:(w + 1) * HV], kds_f, clear_accum=True)
        T.wgmma_gemm(Q_s, K_s[w * HC:(w + 1) * HC, :], p_f, transpose_B=True, clear_accum=True)
        steps.ag_columns(w, A_s, Ag_s, gam_s, beta_s, x_f)
        T.wait_wgmma(0)
        # Pg = scale Gam .* P (rows past the end zero) into dP_s until dP is formed; P stays in p_f for X
        for i, j in T.Parallel(C, HC):
            x_f[i, j] = scale * T.if_then_else(w * HC + j <= i and t0 + i < end,
                                               T.exp(gam_s[i] - gam_s[w * HC + j]), 0.0) * p_f[i, j]
        T.copy(x_f, dP_s[:, w * HC:(w + 1) * HC])
        T.fence_proxy_async()
        T.sync_threads(BAR_AG, 256)
        # dV' = r .* (K dS) + Pg^T dO on this half of the V columns (fp32, then bf16)
        T.wgmma_gemm(dP_s, dO_s[:, w * HV:(w + 1) * HV], prod_f, transpose_A=True, clear_accum=True)
        T.wait_wgmma(0)
        for i, j in T.Parallel(C, HV):
            prod_f[i, j] = prod_f[i, j] + T.if_then_else(t0 + i < end, T.exp(gam_last - gam_s[i]), 0.0) * kds_f[i, j]
        T.copy(prod_f, dVp_s[:, w * HV:(w + 1) * HV])
        T.fence_proxy_async()
        T.sync_threads(BAR_LOCAL[w], 128)
        # dv = Ag^T dV' on this half (stored), dU, W
        steps.dv_du_w(w, Ag_s, dVp_s, dU_s, V_s, U_f, prod_f, red_f, dgu_s, gam_s, dv_out, t0, end, hv)
        # V' = Ag W on this half of the columns
        T.wgmma_gemm(Ag_s, V_s[:, w * HV:(w + 1) * HV], U_f, clear_accum=True)
        T.wait_wgmma(0)
        for i, j in T.Parallel(C, HV):
            Vp_s[i, w * HV + j] = T.cast(U_f[i, j], dtype)
        T.fence_proxy_async()
        T.sync_threads(BAR_VP, 256)
        # this half's columns of dAb = Gam .* dV' W^T and dPg = dO V'^T (P is in p_f already)
        T.wgmma_gemm(dVp_s, V_s[w * HC:(w + 1) * HC, :], cc_f, transpose_B=True, clear_accum=True)
        T.wgmma_gemm(dO_s, Vp_s[w * HC:(w + 1) * HC, :], dpg_f, transpose_B=True, clear_accum=True)
        T.wait_wgmma(0)
        steps.masks(w, lt, colsum, A_s, Ag_s, dP_s, F_s, gam_s, beta_s, dbc_s, cc_f, dpg_f, p_f, x_f, t0, end, scale)
        # the chain's end on this half: eDO into dV'_s's columns (dV' is dead: dAb has read it), then
        # dS = e_C dS + K^T dU + Q^T eDO, in flight under the branch's work
        # (formed in kds_f, dead since dV', and copied whole: a loop reading dO_s and writing dVp_s is serialised by
        # their possible aliasing, as bwd_h_ws's Y was: H200 session 32)
        for i, j in T.Parallel(C, HV):
            kds_f[i, j] = T.if_then_else(t0 + i < end, scale * T.exp(gam_s[i]), 0.0) * dO_s[i, w * HV + j]
        T.copy(kds_f, dVp_s[:, w * HV:(w + 1) * HV])
        T.fence_proxy_async()
        T.sync_threads(BAR_LOCAL[w], 128)
        for i, j in T.Parallel(K, HV):
            dS_f[i, j] = T.exp(gam_last) * dS_f[i, j]
        T.wgmma_gemm(K_s, dU_s[:, w * HV:(w + 1) * HV], dS_f, transpose_A=True)
        T.wgmma_gemm(Q_s, dVp_s[:, w * HV:(w + 1) * HV], dS_f, transpose_A=True)

    @T.prim_func
    def bwd_fused(
        q: T.Tensor((n_tok, h_qk, K), dtype),
        k: T.Tensor((n_tok, h_qk, K), dtype),
        v: T.Tensor((n_tok, h_v, V), dtype),
        do: T.Tensor((n_tok, h_v, V), dtype),
        g_cumsum: T.Tensor((n_tok, h_v), "float32"),
        beta: T.Tensor((n_tok, h_v), "float32"),
        A: T.Tensor((n_tok, h_v, C), dtype),
        h: T.Tensor((n_hc, h_v, K, V), dtype),
        dht: T.Tensor((n_chains, h_v, K, V), "float32"),
        chain_bounds: T.Tensor((n_chains, 4), "int32"),
        dq_out: T.Tensor((n_tok, h_qk, K), dtype),
        dk_out: T.Tensor((n_tok, h_qk, K), dtype),
        dv_out: T.Tensor((n_tok, h_v, V), dtype),
        dbeta_out: T.Tensor((n_tok, h_v), "float32"),
        dg_out: T.Tensor((n_tok, h_v), "float32"),
        dh0_out: T.Tensor((n_chains, h_v, K, V), "float32"),
        scale: T.float32,
    ):
        with T.Kernel(h_v, n_chains, threads=256) as (hv, j):
            Q_s = T.alloc_shared((C, K), dtype)
            K_s = T.alloc_shared((C, K), dtype)
            V_s = T.alloc_shared((C, V), dtype)  # V, then W; then T1 (columns 0..C-1) and dAs (C..2C-1)
            dO_s = T.alloc_shared((C, V), dtype)
            dVp_s = T.alloc_shared((C, V), dtype)  # dV', then eDO
            dU_s = T.alloc_shared((C, V), dtype)
            Vp_s = T.alloc_shared((C, V), dtype)
            S0_s = T.alloc_shared((K, V), dtype)
            dS_s = T.alloc_shared((K, V), dtype)
            A_s = T.alloc_shared((C, C), dtype)
            Ag_s = T.alloc_shared((C, C), dtype)  # Ag, then dA
            dP_s = T.alloc_shared((C, C), dtype)  # Pg, then dP
            F_s = T.alloc_shared((C, C + F_PAD), "float32")  # Y, then X, then dM
            gam_s = T.alloc_shared((C,), "float32")
            beta_s = T.alloc_shared((C,), "float32")
            dgu_s = T.alloc_shared((2, C), "float32")
            kt1_s = T.alloc_shared((C,), "float32")
            sv_s = T.alloc_shared((C,), "float32")
            dgq_s = T.alloc_shared((C,), "float32")
            dgm_s = T.alloc_shared((C,), "float32")
            dbc_s = T.alloc_shared((C,), "float32")
            dbr_s = T.alloc_shared((C,), "float32")
            ld = T.alloc_barrier([128, 128])  # a chunk's tiles in two stages
            # warpgroup 0
            dS0 = T.alloc_fragment((K, HV), "float32")  # dS, columns 0 .. HV - 1
            U0 = T.alloc_fragment((C, HV), "float32")
            kds0 = T.alloc_fragment((C, HV), "float32")
            prod0 = T.alloc_fragment((C, HV), "float32")
            red0 = T.alloc_fragment((C,), "float32")
            cc0 = T.alloc_fragment((C, HC), "float32")
            dpg0 = T.alloc_fragment((C, HC), "float32")
            p0 = T.alloc_fragment((C, HC), "float32")
            x0 = T.alloc_fragment((C, HC), "float32")
            dq_f = T.alloc_fragment((C, K), "float32")
            acc0 = T.alloc_fragment((C, K), "float32")
            T1_f = T.alloc_fragment((C, C), "float32")
            T2_f = T.alloc_fragment((C, C), "float32")
            KK_f = T.alloc_fragment((C, C), "float32")
            red0q = T.alloc_fragment((C,), "float32")
            red0b = T.alloc_fragment((C,), "float32")
            # warpgroup 1
            dS1 = T.alloc_fragment((K, HV), "float32")  # dS, columns HV .. V - 1
            U1 = T.alloc_fragment((C, HV), "float32")
            kds1 = T.alloc_fragment((C, HV), "float32")
            prod1 = T.alloc_fragment((C, HV), "float32")
            red1 = T.alloc_fragment((C,), "float32")
            cc1 = T.alloc_fragment((C, HC), "float32")
            dpg1 = T.alloc_fragment((C, HC), "float32")
            p1 = T.alloc_fragment((C, HC), "float32")
            x1 = T.alloc_fragment((C, HC), "float32")
            dk_f = T.alloc_fragment((C, K), "float32")
            acc1 = T.alloc_fragment((C, K), "float32")
            red1k = T.alloc_fragment((C,), "float32")
            red1m = T.alloc_fragment((C,), "float32")
            gam_last0 = T.alloc_var("float32")
            gam_last1 = T.alloc_var("float32")
            colsum0 = T.alloc_var("float32")
            colsum1 = T.alloc_var("float32")
            tail = T.alloc_var("float32")
            rowsum = T.alloc_var("float32")
            g_next = T.alloc_var("float32", init=0.0)  # the next chunk's gam, beta of this thread's row (lt < C / 2)
            b_next = T.alloc_var("float32", init=0.0)

            tx = T.get_thread_binding()
            bos = chain_bounds[j, 0]
            eos = chain_bounds[j, 1]
            cbase = chain_bounds[j, 2]
            n = chain_bounds[j, 3]
            n_run = T.ceildiv(eos - bos, C)

            if tx < 128:
                T.copy(dht[n, hv, :, 0:HV], dS0)
                for cr in T.serial(n_run):
                    c = n_run - 1 - cr
                    t0 = bos + c * C
                    end = T.min(eos, t0 + C)
                    chunk_part(0, tx, cr, ld, q, k, v, do, dv_out, A, h, g_cumsum, beta, Q_s, K_s, V_s, dO_s, dVp_s,
                               dU_s, Vp_s, A_s, Ag_s, S0_s, dS_s, dP_s, F_s, gam_s, beta_s, dgu_s, dbc_s, dS0, U0,
                               kds0, prod0, red0, cc0, dpg0, p0, x0, gam_last0, colsum0, cbase + c, t0, end, hv,
                               scale, n_run, g_next, b_next, eos, dq_out, dU_s)
                    steps.dq_branch(False, tx, gam_last0, tail, rowsum, hv, Q_s, K_s, V_s, dO_s, S0_s, A_s, Ag_s, dP_s,
                                    F_s, gam_s, beta_s, sv_s, kt1_s, dgu_s, dgq_s, dgm_s, dbc_s, dbr_s, dq_f, acc0,
                                    T1_f, T2_f, KK_f, red0q, red0b, dg_out, dbeta_out, t0, end, scale)
                    T.copy(dq_f, dU_s)  # staged until the next chunk's top (dU_s is free until its dU)
                T.sync_threads(BAR_LOCAL[0], 128)
                steps.flush_rows(dU_s, dq_out, bos, T.min(eos, bos + C), hv)  # the chain's first chunk
                T.copy(dS0, dh0_out[n, hv, :, 0:HV])
            else:
                T.copy(dht[n, hv, :, HV:V], dS1)
                for cr in T.serial(n_run):
                    c = n_run - 1 - cr
                    t0 = bos + c * C
                    end = T.min(eos, t0 + C)
                    chunk_part(1, tx - 128, cr, ld, q, k, v, do, dv_out, A, h, g_cumsum, beta, Q_s, K_s, V_s, dO_s,
                               dVp_s, dU_s, Vp_s, A_s, Ag_s, S0_s, dS_s, dP_s, F_s, gam_s, beta_s, dgu_s, dbc_s, dS1,
                               U1, kds1, prod1, red1, cc1, dpg1, p1, x1, gam_last1, colsum1, cbase + c, t0, end, hv,
                               scale, n_run, g_next, b_next, eos, dk_out, Vp_s)
                    steps.dk_branch(False, False, ld, 0, gam_last1, Q_s, K_s, V_s, Vp_s, dU_s, S0_s, dS_s, dP_s, F_s, gam_s,
                                    sv_s, kt1_s, dgm_s, dk_f, acc1, cc1, red1k, red1m)
                    T.copy(dk_f, Vp_s)  # staged until the next chunk's top (V'_s is free until its V')
                T.sync_threads(BAR_LOCAL[1], 128)
                steps.flush_rows(Vp_s, dk_out, bos, T.min(eos, bos + C), hv)
                T.copy(dS1, dh0_out[n, hv, :, HV:V])

    return compile_for(bwd_fused, arch)
