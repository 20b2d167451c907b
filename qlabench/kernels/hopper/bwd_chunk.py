"""bwd_chunk: every per-chunk gradient of the backward in one block per (chunk, qk-head), on chip.

Formula per chunk and v-head (S0 = h[c] state at the chunk start, dS = dh[c] gradient of the state
at the chunk end, dV' from bwd_dh, A = gate-free A_k, gam = in-chunk cumsum of the log-gate
(last real value repeated), e = exp(gam), r = exp(gam_C - gam), Gam[i, j] = exp(gam_i - gam_j) for
j <= i else 0, Ag = Gam .* A .* beta_col):

    dv  = Ag^T dV' (the gradient of v, stored over dV' in place);   U = K S0;   dU = -diag(e) dv
    W   = V - diag(e) U;   V' = Ag W
    dAb = Gam .* (dV' W^T);   Y = dAb .* A;   dA = dAb .* beta_col
    dPg = dO V'^T;   P = Q K^T;   dP = scale Gam .* dPg
    X   = Y .* beta_col + scale Gam .* P .* dPg                (fp32, through the transpose)
    dq  = scale diag(e) dO S0^T + dP K
    T1  = V' dS^T;   dL = -strict_lower(A^T dA A^T);   dM = diag(beta) dL;   dAs = dM + dM^T
    dk  = diag(r) T1 + dU S0^T + dP^T Q + dAs K
    dbeta_t = colsum(Y)_t + rowsum(dL .* K K^T)_t
    dgam_i  = rowdot(dU, U)_i - r_i rowdot(K, T1)_i + rowdot(Q, dq0)_i + rowsum(X)_i - colsum(X)_i
              with dq0 = scale diag(e) dO S0^T, and on the last real row L the gam_C terms
              exp(gam_C) sum(dS .* S0) + sum_{i < L} r_i rowdot(K, T1)_i (row L's own r-term
              cancels exactly and is never formed; folding onto row L is exact because dg is a
              reverse in-chunk cumsum)
    dg_t    = sum_{s >= t in the chunk} dgam_s                 (the raw gate's gradient)
dq and dk of a qk-head are the sums of the above over its GQA group of v-heads.

This is bwd_state followed by bwd_intra (their math is ``emulate_bwd._emu_state`` then
``_emu_intra``; sm100 still runs them as two kernels, blackwell/bwd_state.py and bwd_intra.py) with
the intermediates dAg, dPg, dq0, dk0, dgam0 kept in registers and shared memory instead of an fp32
write and re-read through HBM, and dq, dk summed over the GQA group in registers and stored once in
the inputs' dtype (no per-v-head fp32 buffers, no host reduction or cast).
The dq and dk work runs on separate warpgroups with the group's v-head loop inside each warpgroup's
branch: with the loop outside the branches ptxas keeps both group sums live in every thread (it cannot
see that a thread only ever takes one branch; session 11 measured 255 registers and a slower kernel),
here warpgroup 0 carries only dq's sum and warpgroup 1 only dk's.
The mask term rowsum(X) - colsum(X) is a cancellation under strong decay, so X stays fp32 and is
differenced element by element (X_ij - X_ji) before the row sum (in a GEMM accumulator's layout, so a
row stays within a quad of lanes); dbeta's column term colsum(Y) takes 4 threads per column and two
shuffles; sum(dS .* S0) takes one K row per thread and a butterfly per warp (bwd_chunk_steps.sv_sum).

Grid: (NCmax chunks, H_qk); blocks of the chunk table's unused rows do nothing. Threads: 256.
Loads are TMA boxes of whole C-row tiles (one elected thread issues them; mbarriers ld_qk, ld[0..3]): rows
past a partial chunk's end hold the next sequence's tokens, so the threads zero them (zero only on the
chunk table's last chunk of a sequence) before any product reads them; rows past the tensor arrive as zeros.
Before the loops, the chunk's Q and K rows (the qk-head's, shared by the group).
Per v-head, each warpgroup w runs (named barriers at 256 threads between the steps, ids BAR_*):
  * loads: after BAR_TOP warpgroup 0 issues the v-head's tiles in the order of first use, ld[0] = S0;
    ld[3] = V, A, dV'; ld[1] = dO (waited for only after V' = Ag W); ld[2] = dS (warpgroup 1 waits
    before V' dS^T); each warpgroup loads its half of gam, beta (element-wise) and waits on ld[0];
  * U = K S0 on its half of the V columns (64x64x128) while V, A, dV' land (ld[3]); Ag of its half of the
    columns (BAR_AG: both halves); dv = Ag^T dV' on its half of the V columns (64x64x64), stored over dV'
    (rows < end; only this block reads or writes them); dU = -diag(e) dv, dgam's e-term partial
    rowdot(dU, U) and W = V - diag(e) U on those columns; then V' = Ag W on them (64x64x64);
  * the C x C products on its half of the columns: dAb = dV' W^T, dPg = dO V'^T (64x32x128), P = Q K^T
    (64x32x128); Y = dAb .* A, X, dA = dAb .* beta_col, dP = scale Gam .* dPg, then dbeta's column term
    colsum(Y) of its columns;
  * warpgroup 0 (dq): dq += scale diag(e) dO S0^T (64x128x128) and rowdot(Q, dq0); dq += dP K (64x128x64);
    the WY-inverse terms A^T dA, T1 A^T (64x64x64), K K^T (64x64x128) -> dbeta's row term and dAs (dM into
    F only once warpgroup 1 has read X there: BAR_XREAD); the hand-off barrier; the dgam0 tail and the
    dg / dbeta stores (warp 0 alone: a butterfly sum and a suffix scan by shuffles, no shared workspace);
  * warpgroup 1 (dk): dgam's mask term rowsum(X) - colsum(X) (then arrives at BAR_XREAD); dk += r .* (V' dS^T)
    (64x128x128) and the r-terms; dk += dU S0^T (64x128x128) + dP^T Q (64x128x64); sum(S0 .* dS) one K row
    per thread; the hand-off barrier; dk += dAs K (64x128x64), in parallel with warpgroup 0's tail.
  Every element-wise step that feeds shared memory (W, dU, Ag, Y, dA, dP, dM, dAs) is formed on a fragment and
  copied whole: written element by element into shared memory its loads never batch (the stores may alias
  them) and in-place updates draw a barrier per element pair.
  The two branches, the tail and the row stores are bwd_chunk_steps.py's macros (bwd_fused runs them too).
  After the loops each warpgroup stores its sum once in the inputs' dtype, staged through a tile both warpgroups are
  done with (warpgroup 0: dO; 1: V'): stmatrix in, 16-byte row segments out (ncu, session 26: the accumulator layout
  stored directly fills half of each 32-byte sector).
Shared memory (bf16 unless said): Q, K, V (then W; after the C x C products T1 in its first 64 columns
and dAs in its last 64), dO, dV', dU, V' 7 x 16 KB; S0, dS 2 x 32 KB; A, Ag (then dA), dP
3 x 8 KB; F (fp32 C x C: Y, then X, then dM; rows padded to C + F_PAD) 17 KB; 10 fp32 C-vectors; 4 mbarriers: 220 KB. Every buffer keeps its
own bytes (TileLang's default merge; no liveness-based overlap between the concurrent branches,
tests/kernels/test_bwd_chunk_compile.py checks the compiled offsets). Registers (cuobjdump -res-usage, sm_90a,
session 26): 240, no local memory.
dv formed here rather than by bwd_dh (session 26): the backward needs one [T, H_v, V] buffer for dV' and dv, not
two (bwd_dh writes dV' into it, this kernel reads it and leaves dv), and bwd_dh no longer stores dv rows.
H200, session 20 (results/h200/2026-12-02_s20/, us, same call each): dAs through a fragment, then also the dg / dbeta
tail on warpgroup 0 with the mask term on warpgroup 1 (call 1): hk16_hv16 1x32768 1414 -> 1307 -> 1266, hk16_hv64
1x32768 3694 -> 3169 -> 3145, hk8_hv16 989 -> 878 -> 881, hk2_hv4 (CP) 301 -> 244 -> 250; then W, dU, Ag, Y, dA, dP,
dM on fragments (call 2): hk16_hv16 1257 -> 899, hk16_hv64 3144 -> 2716, hk8_hv16 882 -> 763, hk2_hv4 247 -> 215.
Gradients' errors against float64 unchanged.
H200, session 16 (results/h200/2026-12-02_s16/bwd-ab-*.log, one call, us, old -> S0 alone on ld[0] -> also the
independent products issued back to back with one wait (wgmma_gemm: dAb, dPg, P; dP K with A^T dA; T1 A^T with
K K^T; dU S0^T with dP^T Q) and U = K S0, V' = Ag W left in flight over the next loads' waits): hk16_hv64
1x32768 4082 -> 3983 -> 3907, hk2_hv8 1x32768 (CP) 512 -> 490 -> 486, hk16_hv64 1000+3001+77 527 -> 511 -> 503;
hk16_hv16 1x32768 (CP) 1431 -> 1385 -> 1403 (run-to-run spread ~4% there); gradients' errors unchanged.
H200, TMA loads in three stages against the element-wise loads of every thread before any product
(results/h200/2026-12-02_s15/bwd-split.log, same call): hk16_hv16 1x32768 1245 vs 1351 us, hk16_hv64 1x32768
3737 vs 4453, hk2_hv8 1x32768 (CP) 519 vs 592; gradients' errors against float64 unchanged.
H200, bwd_chunk alone, us: under GQA against the lockstep tail it replaced (both warpgroups on every
GEMM, the group sums in the registers of both; results/h200/2026-12-01_s12/bwd-gqa-ab.log) hk16_hv64
1x32768 4487 vs 4979, hk2_hv8 1x32768 (CP) 598 vs 656, hk16_hv32 1x16384 1265 vs 1352; with one v-head
per block against session 11's branch kernel (the shared part on both warpgroups in lockstep, then the
dq / dk branches; gqa-kernel-one-head-ab.log) hk16_hv16 1x32768 1345 vs 1355, 8192x4 1357 vs 1367,
hk8_hv8 1x32768 687 vs 687 (session 11). Gradients' errors against float64 unchanged.
scale is a runtime argument.
"""

import functools

import tilelang.language as T

from ..common.build import compile_for
from ..common.tma_rows import zero_rows_past_end
from .bwd_chunk_steps import (
    BAR_AG,
    BAR_LOADED,
    BAR_TOP,
    BAR_VP,
    F_PAD,
    chunk_steps,
)


@functools.cache
def bwd_chunk_kernel(h_qk: int, h_v: int, K: int, V: int, C: int, dtype: str, arch: str):
    assert K == V == 2 * C, "the halves below split K, V and C rows / columns evenly"
    group = h_v // h_qk
    HV = V // 2  # a warpgroup's columns of a C x V product
    HC = C // 2  # a warpgroup's columns of a C x C product, and its rows of the chunk loads
    n_tok = T.dynamic("n_tok")
    n_chunks = T.dynamic("n_chunks")
    n_hc = T.dynamic("n_hc")
    steps = chunk_steps(C, K, V, dtype)

    @T.macro
    def issue_loads(v, do, dvp_dv, A, h, dh, V_s, dO_s, dVp_s, A_s, S0_s, dS_s, ld, c, t0, hv):
        """The v-head's tiles by TMA (one elected thread of the calling warpgroup), in the order of their
        first use: ld[0] S0 (U = K S0); ld[3] V, A, dV' (Ag, dv = Ag^T dV', W, dU); ld[1] dO (after V'); ld[2]
        dS (warpgroup 1 only).
        Whole C-row boxes: rows past the chunk end hold the next sequence's tokens (shared_part zeroes them)
        or lie past the tensor (TMA fills zeros)."""
        T.tma_copy(h[c, hv, :, :], S0_s, barrier=ld[0])
        T.tma_copy(v[t0:t0 + C, hv, :], V_s, barrier=ld[3])
        T.tma_copy(A[t0:t0 + C, hv, :], A_s, barrier=ld[3])
        T.tma_copy(dvp_dv[t0:t0 + C, hv, :], dVp_s, barrier=ld[3])
        T.tma_copy(do[t0:t0 + C, hv, :], dO_s, barrier=ld[1])
        T.tma_copy(dh[c, hv, :, :], dS_s, barrier=ld[2])
        T.mbarrier_arrive(ld[0])
        T.mbarrier_arrive(ld[3])
        T.mbarrier_arrive(ld[1])
        T.mbarrier_arrive(ld[2])

    @T.macro
    def shared_part(w: int, lt, g, ld, v, do, dvp_dv, A, h, dh, g_cumsum, beta, Q_s, K_s, V_s, dO_s, dVp_s, dU_s, Vp_s,
                    A_s, Ag_s, S0_s, dS_s, dP_s, F_s, gam_s, beta_s, dgu_s, dbc_s, U_f, prod_f, red_f, cc_f, dpg_f,
                    p_f, x_f, gam_last: T.Ref, colsum: T.Ref, c, t0, end, hv, scale):
        """Warpgroup w's half of everything both branches need (the header's first three steps)."""
        T.fence_proxy_async()  # this thread's generic writes of the last v-head before the next TMA writes
        T.sync_threads(BAR_TOP, 256)
        if w == 0:
            issue_loads(v, do, dvp_dv, A, h, dh, V_s, dO_s, dVp_s, A_s, S0_s, dS_s, ld, c, t0, hv)
        steps.load_scalars(w, g_cumsum, beta, gam_s, beta_s, t0, end, hv)
        T.mbarrier_wait_parity(ld[0], g & 1)
        # U = K S0 on this half of the columns, in flight while V, A, dV' land and Ag is formed
        T.wgmma_gemm(K_s, S0_s[:, w * HV:(w + 1) * HV], U_f, clear_accum=True)
        T.mbarrier_wait_parity(ld[3], g & 1)
        if end - t0 < C:  # a partial chunk: the rows past its end (V, dV' on this warpgroup's columns, A on its rows)
            for i, j in T.Parallel(C, HV):
                if t0 + i >= end:
                    V_s[i, w * HV + j] = T.cast(0, dtype)
                    dVp_s[i, w * HV + j] = T.cast(0, dtype)
            for i, j in T.Parallel(HC, C):
                if t0 + w * HC + i >= end:
                    A_s[w * HC + i, j] = T.cast(0, dtype)
        T.sync_threads(BAR_LOADED, 256)
        gam_last = gam_s[C - 1]  # noqa: F841 (a store into the caller's T.alloc_var)
        steps.ag_columns(w, A_s, Ag_s, gam_s, beta_s, x_f)  # while U = K S0 is in flight
        T.fence_proxy_async()
        T.sync_threads(BAR_AG, 256)
        # dv = Ag^T dV' over dV' in place (this block alone reads and writes these rows), dU, W
        steps.dv_du_w(w, Ag_s, dVp_s, dU_s, V_s, U_f, prod_f, red_f, dgu_s, gam_s, dvp_dv, t0, end, hv)
        # V' = Ag W on this half of the columns
        # (in flight while dO is waited for and a partial chunk's rows past the end zeroed)
        T.wgmma_gemm(Ag_s, V_s[:, w * HV:(w + 1) * HV], U_f, clear_accum=True)
        T.mbarrier_wait_parity(ld[1], g & 1)
        if end - t0 < C:
            for i, j in T.Parallel(HC, V):
                if t0 + w * HC + i >= end:
                    dO_s[w * HC + i, j] = T.cast(0, dtype)
        T.wait_wgmma(0)
        for i, j in T.Parallel(C, HV):
            Vp_s[i, w * HV + j] = T.cast(U_f[i, j], dtype)
        T.fence_proxy_async()
        T.sync_threads(BAR_VP, 256)
        # this half's columns of dAb = Gam .* dV' W^T, dPg = dO V'^T and P = Q K^T
        # (three independent products issued back to back, one wait)
        T.wgmma_gemm(dVp_s, V_s[w * HC:(w + 1) * HC, :], cc_f, transpose_B=True, clear_accum=True)
        T.wgmma_gemm(dO_s, Vp_s[w * HC:(w + 1) * HC, :], dpg_f, transpose_B=True, clear_accum=True)
        T.wgmma_gemm(Q_s, K_s[w * HC:(w + 1) * HC, :], p_f, transpose_B=True, clear_accum=True)
        T.wait_wgmma(0)
        steps.masks(w, lt, colsum, A_s, Ag_s, dP_s, F_s, gam_s, beta_s, dbc_s, cc_f, dpg_f, p_f, x_f, t0, end, scale)

    @T.prim_func
    def bwd_chunk(
        q: T.Tensor((n_tok, h_qk, K), dtype),
        k: T.Tensor((n_tok, h_qk, K), dtype),
        v: T.Tensor((n_tok, h_v, V), dtype),
        do: T.Tensor((n_tok, h_v, V), dtype),
        dvp_dv: T.Tensor((n_tok, h_v, V), dtype),
        g_cumsum: T.Tensor((n_tok, h_v), "float32"),
        beta: T.Tensor((n_tok, h_v), "float32"),
        A: T.Tensor((n_tok, h_v, C), dtype),
        h: T.Tensor((n_hc, h_v, K, V), dtype),
        dh: T.Tensor((n_hc, h_v, K, V), dtype),
        chunk_bounds: T.Tensor((n_chunks, 2), "int32"),
        dq_out: T.Tensor((n_tok, h_qk, K), dtype),
        dk_out: T.Tensor((n_tok, h_qk, K), dtype),
        dbeta_out: T.Tensor((n_tok, h_v), "float32"),
        dg_out: T.Tensor((n_tok, h_v), "float32"),
        scale: T.float32,
    ):
        with T.Kernel(n_chunks, h_qk, threads=256) as (c, hk):
            Q_s = T.alloc_shared((C, K), dtype)
            K_s = T.alloc_shared((C, K), dtype)
            V_s = T.alloc_shared((C, V), dtype)  # V, then W; then T1 (columns 0..C-1) and dAs (C..2C-1)
            dO_s = T.alloc_shared((C, V), dtype)
            dVp_s = T.alloc_shared((C, V), dtype)
            dU_s = T.alloc_shared((C, V), dtype)
            Vp_s = T.alloc_shared((C, V), dtype)
            S0_s = T.alloc_shared((K, V), dtype)
            dS_s = T.alloc_shared((K, V), dtype)
            A_s = T.alloc_shared((C, C), dtype)
            Ag_s = T.alloc_shared((C, C), dtype)  # Ag, then dA
            dP_s = T.alloc_shared((C, C), dtype)
            F_s = T.alloc_shared((C, C + F_PAD), "float32")  # Y, then X, then dM (rows padded: see F_PAD)
            gam_s = T.alloc_shared((C,), "float32")
            beta_s = T.alloc_shared((C,), "float32")
            dgu_s = T.alloc_shared((2, C), "float32")  # the e-term's two column-half partials
            kt1_s = T.alloc_shared((C,), "float32")
            sv_s = T.alloc_shared((C,), "float32")
            dgq_s = T.alloc_shared((C,), "float32")
            dgm_s = T.alloc_shared((C,), "float32")
            dbc_s = T.alloc_shared((C,), "float32")
            dbr_s = T.alloc_shared((C,), "float32")
            ld_qk = T.alloc_barrier([256])  # Q, K rows (TMA, once per block)
            ld = T.alloc_barrier([128, 128, 128, 128])  # a v-head's tiles in four stages (issue_loads)
            # warpgroup 0
            U0 = T.alloc_fragment((C, HV), "float32")  # U, then V'
            prod0 = T.alloc_fragment((C, HV), "float32")
            red0 = T.alloc_fragment((C,), "float32")
            cc0 = T.alloc_fragment((C, HC), "float32")
            dpg0 = T.alloc_fragment((C, HC), "float32")
            p0 = T.alloc_fragment((C, HC), "float32")
            x0 = T.alloc_fragment((C, HC), "float32")
            dq_f = T.alloc_fragment((C, K), "float32")  # dq summed over the group
            acc0 = T.alloc_fragment((C, K), "float32")  # dq0
            T1_f = T.alloc_fragment((C, C), "float32")
            T2_f = T.alloc_fragment((C, C), "float32")
            KK_f = T.alloc_fragment((C, C), "float32")  # K K^T
            red0q = T.alloc_fragment((C,), "float32")
            red0b = T.alloc_fragment((C,), "float32")
            # warpgroup 1
            U1 = T.alloc_fragment((C, HV), "float32")
            prod1 = T.alloc_fragment((C, HV), "float32")
            red1 = T.alloc_fragment((C,), "float32")
            cc1 = T.alloc_fragment((C, HC), "float32")
            dpg1 = T.alloc_fragment((C, HC), "float32")
            p1 = T.alloc_fragment((C, HC), "float32")
            x1 = T.alloc_fragment((C, HC), "float32")
            dk_f = T.alloc_fragment((C, K), "float32")  # dk summed over the group
            acc1 = T.alloc_fragment((C, K), "float32")  # V' dS^T (then the r-terms in place)
            red1k = T.alloc_fragment((C,), "float32")
            red1m = T.alloc_fragment((C,), "float32")
            gam_last0 = T.alloc_var("float32")
            gam_last1 = T.alloc_var("float32")
            colsum0 = T.alloc_var("float32")
            colsum1 = T.alloc_var("float32")
            tail = T.alloc_var("float32")
            rowsum = T.alloc_var("float32")

            tx = T.get_thread_binding()
            t0 = chunk_bounds[c, 0]
            end = chunk_bounds[c, 1]

            if t0 < end:
                T.tma_copy(q[t0:t0 + C, hk, :], Q_s, barrier=ld_qk[0])
                T.tma_copy(k[t0:t0 + C, hk, :], K_s, barrier=ld_qk[0])
                T.mbarrier_arrive(ld_qk[0])
                T.mbarrier_wait_parity(ld_qk[0], 0)
                zero_rows_past_end(Q_s, K_s, t0, end, C, K, dtype)
                T.fence_proxy_async()
                T.sync_threads()
                if tx < 128:
                    T.clear(dq_f)
                    for g in T.serial(group):
                        hv = hk * group + g
                        shared_part(0, tx, g, ld, v, do, dvp_dv, A, h, dh, g_cumsum, beta, Q_s, K_s, V_s, dO_s, dVp_s,
                                    dU_s, Vp_s, A_s, Ag_s, S0_s, dS_s, dP_s, F_s, gam_s, beta_s, dgu_s, dbc_s, U0,
                                    prod0, red0, cc0, dpg0, p0, x0, gam_last0, colsum0, c, t0, end, hv, scale)
                        steps.dq_branch(True, tx, gam_last0, tail, rowsum, hv, Q_s, K_s, V_s, dO_s, S0_s, A_s, Ag_s,
                                        dP_s, F_s, gam_s, beta_s, sv_s, kt1_s, dgu_s, dgq_s, dgm_s, dbc_s, dbr_s,
                                        dq_f, acc0, T1_f, T2_f, KK_f, red0q, red0b, dg_out, dbeta_out, t0, end, scale)
                    steps.store_rows(0, dq_f, dO_s, dq_out, t0, end, hk)  # dO_s: dead once past the last BAR_HANDOFF
                else:
                    T.clear(dk_f)
                    for g in T.serial(group):
                        hv = hk * group + g
                        shared_part(1, tx - 128, g, ld, v, do, dvp_dv, A, h, dh, g_cumsum, beta, Q_s, K_s, V_s, dO_s,
                                    dVp_s, dU_s, Vp_s, A_s, Ag_s, S0_s, dS_s, dP_s, F_s, gam_s, beta_s, dgu_s, dbc_s,
                                    U1, prod1, red1, cc1, dpg1, p1, x1, gam_last1, colsum1, c, t0, end, hv, scale)
                        steps.dk_branch(True, True, ld, g & 1, gam_last1, Q_s, K_s, V_s, Vp_s, dU_s, S0_s, dS_s, dP_s,
                                        F_s, gam_s, sv_s, kt1_s, dgm_s, dk_f, acc1, cc1, red1k, red1m)
                    steps.store_rows(1, dk_f, Vp_s, dk_out, t0, end, hk)  # V' is dead there too

    return compile_for(bwd_chunk, arch)
