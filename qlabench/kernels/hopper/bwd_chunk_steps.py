"""The per-chunk gradient steps that hopper/bwd_chunk.py and hopper/bwd_fused.py share (Hopper, sm_90a).

Both kernels run one chunk's gradients on two warpgroups of 128 threads over the same shared tiles (bwd_chunk.py's
header has the formula, the tiles and the 220 KB budget): after the shared steps, warpgroup 0 takes the dq branch (dq,
the WY-inverse terms, then the dg / dbeta tail) and warpgroup 1 the dk branch (dgam's mask term, dk with its r-terms).
bwd_chunk sums dq and dk over a GQA group's v-heads in registers (``accumulate``) and waits for dS's tile before the
dk branch reads it (``wait_ds``); bwd_fused forms one v-head per block with dS already in shared memory.

`chunk_steps(C, K, V, dtype)` builds the macros for one kernel shape; the named barriers below are both kernels'.
"""

from types import SimpleNamespace

import tilelang.language as T

from ..common.bwd_intra import wy_inverse_grad
from ..common.bwd_state import kt1_terms

# named barriers (0-4 are TileLang's own)
BAR_TOP = 5  # both warpgroups finished the previous v-head: its buffers may be overwritten
BAR_LOADED = 6  # the v-head's rows and states are in shared memory
BAR_W = 7  # Ag rows, W and dU columns of both halves
BAR_VP = 8  # V' columns of both halves (and both warpgroups past V' = Ag W: Ag may become dA)
BAR_MASKS = 9  # Y's column sums, X, dA, dP of both halves
BAR_HANDOFF = 10  # dAs to warpgroup 1; the dbeta row term, dgq (warpgroup 0) and dgm, kt1, sv (1) for the tail
BAR_LOCAL = (11, 12)  # a warpgroup's own 128-thread barrier
BAR_XREAD = 13  # warpgroup 1 has read X (the mask term) out of F_s: warpgroup 0 may write dM there
BAR_AG = 14  # Ag of both halves (dv = Ag^T dV' reads all of it)
# fp32 columns of row padding of F_s: X_ij - X_ji and dM_ij + dM_ji read it transposed in the accumulator layout, where
# unpadded rows (64 floats) put a warp's 32 reads in 8 banks; at 68 floats they fall in 32 (and the row-wise writes
# in 2-way rather than 4-way conflicts)
F_PAD = 4


def chunk_steps(C: int, K: int, V: int, dtype: str) -> SimpleNamespace:
    """The shared macros for chunks of C tokens, head dims K = V = 2 C, tiles in ``dtype``: load_scalars, ag_columns,
    dv_du_w and masks (steps of both warpgroups), dq_branch, dk_branch, sv_sum, dg_tail, flush_rows, store_rows."""
    HC = C // 2
    HV = V // 2
    assert HC == 32, "dg_tail maps a warp's 32 lanes onto the chunk's row pairs"

    @T.macro
    def load_scalars(w: int, g_cumsum, beta, gam_s, beta_s, t0, end, hv):
        """Warpgroup w's half of the chunk's gate cumsum (last real value repeated) and beta (zero past the end)."""
        for i in T.Parallel(HC):
            gam_s[w * HC + i] = g_cumsum[T.min(t0 + w * HC + i, end - 1), hv]
            beta_s[w * HC + i] = T.if_then_else(t0 + w * HC + i < end, beta[t0 + w * HC + i, hv], 0.0)

    @T.macro
    def ag_columns(w: int, A_s, Ag_s, gam_s, beta_s, x_f):
        """Ag = Gam .* A .* beta_col on warpgroup w's C / 2 columns (in x_f: a product's accumulator touched while
        another product is in flight makes ptxas wait for it)."""
        for i, j in T.Parallel(C, HC):
            x_f[i, j] = (T.if_then_else(w * HC + j <= i, T.exp(gam_s[i] - gam_s[w * HC + j]), 0.0)
                         * A_s[i, w * HC + j] * beta_s[w * HC + j])
        T.copy(x_f, Ag_s[:, w * HC:(w + 1) * HC])

    @T.macro
    def dv_du_w(w: int, Ag_s, dVp_s, dU_s, V_s, U_f, prod_f, red_f, dgu_s, gam_s, dv_out, t0, end, hv):
        """On warpgroup w's V / 2 columns: dv = Ag^T dV' (stored: stmatrix into dU_s's columns, free until dU is
        written, then 16-byte row segments out); dU = -diag(e) dv into dU_s; dgam's e-term partial rowdot(dU, U);
        W = V - diag(e) U over V_s (U in U_f); then both warpgroups' W and dU (BAR_W)."""
        T.wgmma_gemm(Ag_s, dVp_s[:, w * HV:(w + 1) * HV], prod_f, transpose_A=True, clear_accum=True)
        T.wait_wgmma(0)
        T.copy(prod_f, dU_s[:, w * HV:(w + 1) * HV])
        T.sync_threads(BAR_LOCAL[w], 128)
        for i, j in T.Parallel(C, HV):
            if t0 + i < end:
                dv_out[t0 + i, hv, w * HV + j] = dU_s[i, w * HV + j]
        T.sync_threads(BAR_LOCAL[w], 128)
        for i, j in T.Parallel(C, HV):
            prod_f[i, j] = -T.exp(gam_s[i]) * prod_f[i, j]
        T.copy(prod_f, dU_s[:, w * HV:(w + 1) * HV])
        for i, j in T.Parallel(C, HV):
            prod_f[i, j] = prod_f[i, j] * U_f[i, j]
        T.reduce_sum(prod_f, red_f, dim=1)
        for i in T.Parallel(C):
            dgu_s[w, i] = red_f[i]
        for i, j in T.Parallel(C, HV):
            U_f[i, j] = V_s[i, w * HV + j] - T.exp(gam_s[i]) * U_f[i, j]
        T.copy(U_f, V_s[:, w * HV:(w + 1) * HV])
        T.fence_proxy_async()
        T.sync_threads(BAR_W, 256)

    @T.macro
    def masks(w: int, lt, colsum: T.Ref, A_s, Ag_s, dP_s, F_s, gam_s, beta_s, dbc_s, cc_f, dpg_f, p_f, x_f, t0, end,
              scale):
        """On warpgroup w's C / 2 columns, from dAb (cc_f), dPg (dpg_f) and P (p_f): X (into F_s last), Y (F_s),
        dA (over Ag_s), dP (dP_s); dbeta's column term colsum(Y) (4 threads per column, 16 rows each); then both
        warpgroups' (BAR_MASKS)."""
        for i, j in T.Parallel(C, HC):
            dec = T.if_then_else(w * HC + j <= i and t0 + i < end, T.exp(gam_s[i] - gam_s[w * HC + j]), 0.0)
            x_f[i, j] = (dec * cc_f[i, j] * A_s[i, w * HC + j] * beta_s[w * HC + j]
                         + scale * dec * p_f[i, j] * dpg_f[i, j])  # X
            p_f[i, j] = dec * cc_f[i, j] * A_s[i, w * HC + j]  # Y
            cc_f[i, j] = dec * cc_f[i, j] * beta_s[w * HC + j]  # dA
            dpg_f[i, j] = scale * dec * dpg_f[i, j]  # dP
        T.copy(p_f, F_s[:, w * HC:(w + 1) * HC])
        T.copy(cc_f, Ag_s[:, w * HC:(w + 1) * HC])
        T.copy(dpg_f, dP_s[:, w * HC:(w + 1) * HC])
        T.sync_threads(BAR_LOCAL[w], 128)
        colsum = 0.0
        for r in T.serial(C // 4):
            colsum = colsum + F_s[(lt & 3) * (C // 4) + r, w * HC + (lt >> 2)]
        colsum = colsum + T.shfl_xor(colsum, 1)
        colsum = colsum + T.shfl_xor(colsum, 2)
        if (lt & 3) == 0:
            dbc_s[w * HC + (lt >> 2)] = colsum
        T.sync_threads(BAR_LOCAL[w], 128)
        for i, j in T.Parallel(C, HC):
            F_s[i, w * HC + j] = x_f[i, j]
        T.fence_proxy_async()
        T.sync_threads(BAR_MASKS, 256)

    @T.macro
    def dg_tail(lt, gam_last: T.Ref, tail: T.Ref, rowsum: T.Ref, hv, sv_s, kt1_s, dgu_s, dgq_s, dgm_s, dbc_s, dbr_s,
                dg_out, dbeta_out, t0, end):
        """dgam0 = e-term - r-terms; the last real row L gets exp(gam_last) sum(S0 .* dS) + sum_{i < L} r-terms;
        then dgam = dgam0 + rowdot(Q, dq0) + mask term; dg = its reverse in-chunk cumsum, dbeta = column term + row
        term. Warp 0 of warpgroup 0 alone, lane l owning rows 2 l and 2 l + 1, with shuffles only: a butterfly sum for
        row L's term and a suffix scan over the lanes for the cumsum (~10 shuffle steps; the former thread-pair loops
        summed 2 x 32 shared-memory terms serially on warpgroup 0's path to the next chunk)."""
        if lt < 32:
            # the last real row's extra term exp(gam_last) sum(S0 .* dS) + sum_{i < L} kt1_i: a butterfly sum
            tail = (T.exp(gam_last) * sv_s[lt] + T.if_then_else(t0 + lt < end - 1, kt1_s[lt], 0.0)
                    + T.exp(gam_last) * sv_s[lt + HC] + T.if_then_else(t0 + lt + HC < end - 1, kt1_s[lt + HC], 0.0))
            for s in T.unroll(5):
                tail = tail + T.shfl_xor(tail, 16 >> s)
            pair = T.alloc_local((4,), "float32")  # dgam of rows 2 l, 2 l + 1, then the suffix sums
            for e in T.unroll(2):
                pair[e] = T.if_then_else(
                    t0 + 2 * lt + e < end,
                    dgu_s[0, 2 * lt + e] + dgu_s[1, 2 * lt + e]
                    + T.if_then_else(t0 + 2 * lt + e == end - 1, tail, -kt1_s[2 * lt + e])
                    + dgq_s[2 * lt + e] + dgm_s[2 * lt + e], 0.0)
            # inclusive suffix sum over the lanes of the pair sums (Kogge-Stone, shuffles down)
            rowsum = pair[0] + pair[1]
            for s in T.unroll(5):
                pair[2] = T.shfl_down(rowsum, 1 << s)
                rowsum = rowsum + T.if_then_else(lt + (1 << s) < 32, pair[2], 0.0)
            pair[3] = T.shfl_down(rowsum, 1)  # the suffix from row 2 l + 2
            pair[1] = pair[1] + T.if_then_else(lt < 31, pair[3], 0.0)
            pair[0] = pair[0] + pair[1]
            for e in T.unroll(2):
                if t0 + 2 * lt + e < end:
                    dg_out[t0 + 2 * lt + e, hv] = pair[e]
                    dbeta_out[t0 + 2 * lt + e, hv] = dbc_s[2 * lt + e] + dbr_s[2 * lt + e]

    @T.macro
    def flush_rows(stage_s, out, r0, r_end, head):
        """A staged C x K tile's rows r0 .. r_end - 1 out as whole 16-byte row segments (the accumulator layout
        stored directly fills half of each 32-byte sector)."""
        for i, j in T.Parallel(C, K):
            if r0 + i < r_end:
                out[r0 + i, head, j] = stage_s[i, j]

    @T.macro
    def store_rows(w: int, acc, stage_s, out, t0, end, head):
        """Warpgroup w's dq or dk out in the inputs' dtype, through a tile no one reads any more (stmatrix in, then
        flush_rows)."""
        T.copy(acc, stage_s)
        T.sync_threads(BAR_LOCAL[w], 128)
        flush_rows(stage_s, out, t0, end, head)

    @T.macro
    def sv_sum(S0_s, dS_s, sv_s):
        """sum(S0 .* dS) for the dgam0 tail on warpgroup 1: one K row per thread (16-byte row segments, fp32 products
        summed in 8 lanes, then along the row), a butterfly per warp, the 4 warp sums into sv_s[0:4] and zeros in
        sv_s[4:C] (dg_tail sums all C). Session 29's probes had the former C x V fragment reduction at ~2.2 k cycles
        of warpgroup 1's ~26 k per chunk; with it bwd_fused's deferred dq / dk stores gained 0.967x against 0.981x
        alone (session 31). In bwd_chunk (once per v-head of the group) its cost against the fragment version is
        unmeasured: session 32's one-call A/B (results/h200/2026-12-04_s32/call1/) ran this version on both sides (the
        variant tree on PYTHONPATH was shadowed by `python -m`; results/h200/NOTES.md, session 33), so session 31's
        cross-call 1.015-1.023x on the hk16_hv32 32k rows is still open."""
        lt = T.get_thread_binding() - 128
        seg = T.alloc_local((8,), "float32")
        part = T.alloc_var("float32", init=0.0)
        for e in T.vectorized(8):
            seg[e] = 0.0
        for jj in T.serial(V // 8):
            for e in T.vectorized(8):
                seg[e] = seg[e] + T.cast(S0_s[lt, jj * 8 + e], "float32") * T.cast(dS_s[lt, jj * 8 + e], "float32")
        part = ((seg[0] + seg[1]) + (seg[2] + seg[3])) + ((seg[4] + seg[5]) + (seg[6] + seg[7]))
        for s in T.unroll(5):
            part = part + T.shfl_xor(part, 16 >> s)
        if lt < C:
            sv_s[lt] = 0.0
        T.sync_threads(BAR_LOCAL[1], 128)
        if lt % 32 == 0:
            sv_s[lt // 32] = part

    @T.macro
    def dq_branch(accumulate: bool, lt, gam_last: T.Ref, tail: T.Ref, rowsum: T.Ref, hv, Q_s, K_s, V_s, dO_s, S0_s,
                  A_s, Ag_s, dP_s, F_s, gam_s, beta_s, sv_s, kt1_s, dgu_s, dgq_s, dgm_s, dbc_s, dbr_s, dq_f,
                  acc0, T1_f, T2_f, KK_f, red0q, red0b, dg_out, dbeta_out, t0, end, scale):
        """Warpgroup 0 after the shared steps: dq (added to dq_f with ``accumulate``, else into it), the WY-inverse
        terms, the hand-off, the dg / dbeta tail."""
        # dq = dq0 + dP K with dq0 = scale diag(e) dO S0^T; rowdot(Q, dq0) for dgam
        T.gemm(dO_s, S0_s, acc0, transpose_B=True, clear_accum=True)
        for i, j in T.Parallel(C, K):
            acc0[i, j] = scale * T.exp(gam_s[i]) * acc0[i, j]
            if accumulate:
                dq_f[i, j] = dq_f[i, j] + acc0[i, j]
            else:
                dq_f[i, j] = acc0[i, j]
        for i, j in T.Parallel(C, K):
            acc0[i, j] = Q_s[i, j] * acc0[i, j]
        T.reduce_sum(acc0, red0q, dim=1)
        for i in T.Parallel(C):
            dgq_s[i] = red0q[i]
        # WY inverse: T1 = A^T dA into W's first columns (W is dead), dL = -strict_lower(T1 A^T), dbeta's row term,
        # dAs = dM + dM^T into W's last columns (independent products issued in pairs, one wait each: dP K with
        # A^T dA, T1 A^T with K K^T)
        T.wgmma_gemm(dP_s, K_s, dq_f)
        T.wgmma_gemm(A_s, Ag_s, T1_f, transpose_A=True, clear_accum=True)
        T.wait_wgmma(0)
        for i, j in T.Parallel(C, C):
            V_s[i, j] = T.cast(T1_f[i, j], dtype)
        T.fence_proxy_async()
        T.sync_threads(BAR_LOCAL[0], 128)
        T.wgmma_gemm(V_s[:, 0:C], A_s, T2_f, transpose_B=True, clear_accum=True)
        T.wgmma_gemm(K_s, K_s, KK_f, transpose_B=True, clear_accum=True)
        T.wait_wgmma(0)
        T.sync_threads(BAR_XREAD, 256)  # warpgroup 1 has read X out of F_s
        wy_inverse_grad(T2_f, KK_f, beta_s, KK_f, red0b, F_s, dbr_s, V_s, C, dtype, C)
        T.fence_proxy_async()
        T.sync_threads(BAR_HANDOFF, 256)
        dg_tail(lt, gam_last, tail, rowsum, hv, sv_s, kt1_s, dgu_s, dgq_s, dgm_s, dbc_s, dbr_s, dg_out, dbeta_out, t0,
                end)

    @T.macro
    def dk_branch(accumulate: bool, wait_ds: bool, ld, parity, gam_last: T.Ref, Q_s, K_s, V_s, Vp_s, dU_s, S0_s, dS_s,
                  dP_s, F_s, gam_s, sv_s, kt1_s, dgm_s, dk_f, acc1, cc1, red1k, red1m):
        """Warpgroup 1 after the shared steps: dgam's mask term, then dk = r .* (V' dS^T) + dU S0^T + dP^T Q + dAs K
        (added to dk_f with ``accumulate``, else into it) with the r-terms of dgam; ``wait_ds``: dS's tile lands on
        mbarrier ld[2] (waited for with ``parity``), else it is in shared memory already."""
        # dgam's mask term rowsum(X) - colsum(X), then X's shared tile is free
        # (by column halves in cc1: a product accumulator, whose rows stay within a quad of lanes)
        for i, j in T.Parallel(C, HC):
            cc1[i, j] = F_s[i, j] - F_s[j, i]
        T.reduce_sum(cc1, red1m, dim=1)
        for i, j in T.Parallel(C, HC):
            cc1[i, j] = F_s[i, HC + j] - F_s[HC + j, i]
        T.reduce_sum(cc1, red1m, dim=1, clear=False)
        for i in T.Parallel(C):
            dgm_s[i] = red1m[i]
        T.named_barrier_arrive(BAR_XREAD, 256)
        if wait_ds:
            T.mbarrier_wait_parity(ld[2], parity)
        T.gemm(Vp_s, dS_s, acc1, transpose_B=True, clear_accum=True)
        for i, j in T.Parallel(C, K):
            if accumulate:
                dk_f[i, j] = dk_f[i, j] + T.exp(gam_last - gam_s[i]) * acc1[i, j]
            else:
                dk_f[i, j] = T.exp(gam_last - gam_s[i]) * acc1[i, j]
        kt1_terms(K_s, acc1, gam_s, gam_last, acc1, red1k, kt1_s, C, K)  # in place over acc1
        T.wgmma_gemm(dU_s, S0_s, dk_f, transpose_B=True)  # both into dk_f, one wait
        T.wgmma_gemm(dP_s, Q_s, dk_f, transpose_A=True)
        T.wait_wgmma(0)
        sv_sum(S0_s, dS_s, sv_s)
        T.sync_threads(BAR_HANDOFF, 256)
        T.gemm(V_s[:, C:2 * C], K_s, dk_f)  # dAs K

    return SimpleNamespace(load_scalars=load_scalars, ag_columns=ag_columns, dv_du_w=dv_du_w, masks=masks,
                           dg_tail=dg_tail, flush_rows=flush_rows, store_rows=store_rows, sv_sum=sv_sum,
                           dq_branch=dq_branch, dk_branch=dk_branch)
