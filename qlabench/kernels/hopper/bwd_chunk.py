"""bwd_chunk: every per-chunk gradient of the backward in one block per (chunk, qk-head), on chip.

Formula per chunk and v-head (S0 = h[c] state at the chunk start, dS = dh[c] gradient of the state
at the chunk end, dV' and dv from bwd_dh, A = gate-free A_k, gam = in-chunk cumsum of the log-gate
(last real value repeated), e = exp(gam), r = exp(gam_C - gam), Gam[i, j] = exp(gam_i - gam_j) for
j <= i else 0, Ag = Gam .* A .* beta_col):

    U   = K S0;   dU = -diag(e) dv;   W = V - diag(e) U;   V' = Ag W
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
write and re-read through HBM. This file is the one-v-head-per-block form (H_v == H_qk); under GQA
``bwd_chunk_kernel`` returns bwd_chunk_gqa.py's kernel, which sums dq, dk over the group in registers
(the v-head loop inside each warpgroup's branch) and stores them once in the inputs' dtype.
The mask term rowsum(X) - colsum(X) is a cancellation under strong decay, so X stays fp32 and is
differenced element by element (X_ij - X_ji) before the row sum; column sums are row sums of the
transposed shared tile (every reduction is along the last dimension); sum(dS .* S0) and the last
row's term are tree reductions (common/bwd_state.sv_rows, dgam0_from_sv).

Grid: (NCmax chunks, H_qk = H_v); blocks of the chunk table's unused rows (start == end) do nothing.
Threads: 256, two warpgroups. Both warpgroups first run the shared part (every GEMM has
M = 64 and the warp policy splits N): K S0 (64x128x128), Ag W (64x128x64), dV' W^T, dO V'^T, Q K^T
(64x64x128), with the e-term, Y, dA, dbeta's column term, X, dP and dgam's mask term.
Then the two branches run on separate warpgroups, each GEMM
at full N on one warpgroup (named barriers only; TileLang's automatic syncs become 128-thread ones):
  * warpgroup 0 (dq): dO S0^T (64x128x128) -> dq0, rowdot(Q, dq0); dq = dq0 + dP K (64x128x64),
    stored; the WY-inverse terms: A^T dA, T1 A^T (64x64x64), K K^T (64x64x128) -> dbeta's row term
    and dAs; then it arrives at the hand-off barrier (BAR_HANDOFF).
  * warpgroup 1 (dk): V' dS^T (64x128x128) -> dk = r .* (V' dS^T) and the r-terms; dk += dU S0^T
    (64x128x128) + dP^T Q (64x128x64); sum(S0 .* dS) as row pairs; waits for dAs; dk += dAs K, stored.
  * both: dgam0 (the last real row's sums as one C x C reduction) and the dg / dbeta stores.
  H200, bwd_chunk alone, us (results/h200/2026-12-01_s11/bwd-chunk-branches-ab.log): hk16_hv16
  1x32768 1352 vs 1571 for the lockstep tail, 8192x4 1353 vs 1539, hk8_hv8 1x32768 687 vs 763.
Under GQA these branches with the v-head loop around them measured slower than the lockstep tail (ptxas
keeps both group sums live in every thread: hk16_hv64 1x32768 5450 vs 4953 us, bwd-chunk-v2-ab.log);
bwd_chunk_gqa.py moves the loop inside the branches instead (session 12: 4487 vs 4979).
Shared memory (bf16 unless said): Q, K, V (then W), dO, dV', dv (then dU), V' 7 x 16 KB; S0, dS
2 x 32 KB; A, Ag (then dA), dP, T1, dAs 5 x 8 KB; F (fp32 C x C: Y, then X, then dM) 16 KB; C / K
vectors fp32 ~3 KB: 242 KB if every buffer lived through the kernel; compiled with TileLang's
liveness-based aggressive merge, which overlaps the dead ones: 193 KB of the 227 KB (one block per
SM). The merge orders the two branches as written (dq's, then dk's), so a buffer only the dk branch
writes could land on one the concurrent dq branch uses: the dk branch's own outputs (kt1, sv) are
written before the branches to pin their lifetimes, and tests/kernels/test_bwd_chunk_compile.py reads
the compiled offsets to check it. Registers (ptxas, sm_90a): 173, no spills.
scale is a runtime argument (one compiled kernel serves every scale).
"""

import functools

import tilelang
import tilelang.language as T

from ..common.build import compile_for
from ..common.bwd_intra import store_dg_dbeta, wy_inverse_grad
from ..common.bwd_state import dgam0_from_sv, kt1_terms, load_chunk, sv_rows, w_and_du
from .bwd_chunk_gqa import bwd_chunk_gqa_kernel

BAR_HANDOFF = 8  # named barrier: the dq warpgroup's dAs to the dk warpgroup (0-4 are TileLang's)


@functools.cache
def bwd_chunk_kernel(h_qk: int, h_v: int, K: int, V: int, C: int, dtype: str, arch: str):
    assert K == V == 2 * C, "prod_f serves C x V and C x K row dots; S0 .* dS is summed as two C-row blocks"
    group = h_v // h_qk
    if group > 1:  # GQA: the v-head loop inside each warpgroup's branch (bwd_chunk_gqa.py)
        return bwd_chunk_gqa_kernel(h_qk, h_v, K, V, C, dtype, arch)
    n_tok = T.dynamic("n_tok")
    n_chunks = T.dynamic("n_chunks")
    n_hc = T.dynamic("n_hc")

    @T.macro
    def store_rows(acc, out, t0, end, hk):
        for i, j in T.Parallel(C, K):
            if t0 + i < end:
                out[t0 + i, hk, j] = T.cast(acc[i, j], dtype)

    @T.prim_func
    def bwd_chunk(
        q: T.Tensor((n_tok, h_qk, K), dtype),
        k: T.Tensor((n_tok, h_qk, K), dtype),
        v: T.Tensor((n_tok, h_v, V), dtype),
        do: T.Tensor((n_tok, h_v, V), dtype),
        dvp: T.Tensor((n_tok, h_v, V), dtype),
        dv: T.Tensor((n_tok, h_v, V), dtype),
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
            V_s = T.alloc_shared((C, V), dtype)  # V, then W = V - diag(e) U
            dO_s = T.alloc_shared((C, V), dtype)
            dVp_s = T.alloc_shared((C, V), dtype)
            dv_s = T.alloc_shared((C, V), dtype)  # dv, then dU = -diag(e) dv
            Vp_s = T.alloc_shared((C, V), dtype)
            S0_s = T.alloc_shared((K, V), dtype)
            dS_s = T.alloc_shared((K, V), dtype)
            A_s = T.alloc_shared((C, C), dtype)
            Ag_s = T.alloc_shared((C, C), dtype)  # Ag, then dA = dAb .* beta_col
            dP_s = T.alloc_shared((C, C), dtype)
            T1_s = T.alloc_shared((C, C), dtype)
            dAs_s = T.alloc_shared((C, C), dtype)
            F_s = T.alloc_shared((C, C), "float32")  # Y, then X, then dM
            gam_s = T.alloc_shared((C,), "float32")
            beta_s = T.alloc_shared((C,), "float32")
            dgu_s = T.alloc_shared((C,), "float32")
            kt1_s = T.alloc_shared((C,), "float32")
            sv_s = T.alloc_shared((C,), "float32")
            dgam_s = T.alloc_shared((C,), "float32")
            dgq_s = T.alloc_shared((C,), "float32")
            dgm_s = T.alloc_shared((C,), "float32")
            dbc_s = T.alloc_shared((C,), "float32")
            dbr_s = T.alloc_shared((C,), "float32")
            # both warpgroups (every GEMM's N split between them)
            acc_a = T.alloc_fragment((C, V), "float32")  # U, then V'
            acc_cc = T.alloc_fragment((C, C), "float32")  # dAg, then dPg
            P_f = T.alloc_fragment((C, C), "float32")  # Q K^T
            prod_f = T.alloc_fragment((C, V), "float32")
            red_f = T.alloc_fragment((C,), "float32")
            redc = T.alloc_fragment((C,), "float32")
            redm = T.alloc_fragment((C,), "float32")
            redg = T.alloc_fragment((C,), "float32")
            T1_f = T.alloc_fragment((C, C), "float32")
            T2_f = T.alloc_fragment((C, C), "float32")
            redl = T.alloc_fragment((C,), "float32")
            # dq warpgroup
            dq_f = T.alloc_fragment((C, K), "float32")
            acc0 = T.alloc_fragment((C, K), "float32")  # dq0
            KK_f = T.alloc_fragment((C, C), "float32")
            red0q = T.alloc_fragment((C,), "float32")
            red0b = T.alloc_fragment((C,), "float32")
            # dk warpgroup
            dk_f = T.alloc_fragment((C, K), "float32")
            acc1 = T.alloc_fragment((C, K), "float32")  # T1 = V' dS^T, then S0 .* dS row pairs
            red1 = T.alloc_fragment((C,), "float32")
            red1s = T.alloc_fragment((C,), "float32")
            gam_last = T.alloc_var("float32")

            tx = T.get_thread_binding()
            t0 = chunk_bounds[c, 0]
            end = chunk_bounds[c, 1]

            if t0 < end:
                for i, d in T.Parallel(C, K):
                    Q_s[i, d] = T.if_then_else(t0 + i < end, q[t0 + i, hk, d], T.cast(0, dtype))
                for g in T.serial(group):  # group == 1 here (the loop keeps TileLang's sync placement)
                    hv = hk * group + g
                    load_chunk(k, v, do, dvp, dv, A, h, dh, g_cumsum, beta, K_s, V_s, dO_s, dVp_s, dv_s, A_s, S0_s,
                               dS_s, gam_s, beta_s, Ag_s, gam_last, c, t0, end, hk, hv, C, K, V, dtype)

                    # U = K S0; dgam's e-term; W and dU in place; V' = Ag W
                    T.gemm(K_s, S0_s, acc_a, clear_accum=True)
                    w_and_du(acc_a, dv_s, V_s, gam_s, prod_f, red_f, dgu_s, C, V, dtype)
                    T.gemm(Ag_s, V_s, acc_a, clear_accum=True)
                    T.copy(acc_a, Vp_s)

                    # dAb = Gam .* dV' W^T: Y = dAb .* A into F, dA = dAb .* beta_col over Ag (dead)
                    T.gemm(dVp_s, V_s, acc_cc, transpose_B=True, clear_accum=True)
                    for i, j in T.Parallel(C, C):
                        dab = T.if_then_else(j <= i and t0 + i < end, T.exp(gam_s[i] - gam_s[j]) * acc_cc[i, j], 0.0)
                        F_s[i, j] = dab * A_s[i, j]
                        Ag_s[i, j] = T.cast(dab * beta_s[j], dtype)
                    for i, j in T.Parallel(C, C):  # dbeta's column term colsum(Y) (P_f: free until Q K^T)
                        P_f[i, j] = F_s[j, i]
                    T.reduce_sum(P_f, redc, dim=1)
                    for i in T.Parallel(C):
                        dbc_s[i] = redc[i]

                    # dPg = dO V'^T, P = Q K^T: X = Y .* beta_col + scale Gam .* P .* dPg, dP = scale Gam .* dPg
                    T.gemm(dO_s, Vp_s, acc_cc, transpose_B=True, clear_accum=True)
                    T.gemm(Q_s, K_s, P_f, transpose_B=True, clear_accum=True)
                    for i, j in T.Parallel(C, C):
                        sdec = T.if_then_else(j <= i and t0 + i < end, scale * T.exp(gam_s[i] - gam_s[j]), 0.0)
                        F_s[i, j] = F_s[i, j] * beta_s[j] + sdec * P_f[i, j] * acc_cc[i, j]
                        dP_s[i, j] = T.cast(sdec * acc_cc[i, j], dtype)
                    for i, j in T.Parallel(C, C):  # dgam's mask term rowsum(X) - colsum(X) (P_f is dead)
                        P_f[i, j] = F_s[i, j] - F_s[j, i]
                    T.reduce_sum(P_f, redm, dim=1)
                    for i in T.Parallel(C):
                        dgm_s[i] = redm[i]
                        kt1_s[i] = 0.0  # written by the dk warpgroup: touched before the branches, so never
                        sv_s[i] = 0.0  # merged over a buffer of the concurrent dq warpgroup

                    T.sync_threads()
                    if tx < 128:
                        # dq = dq0 + dP K with dq0 = scale diag(e) dO S0^T; rowdot(Q, dq0) for dgam
                        T.gemm(dO_s, S0_s, acc0, transpose_B=True, clear_accum=True)
                        for i, j in T.Parallel(C, K):
                            acc0[i, j] = scale * T.exp(gam_s[i]) * acc0[i, j]
                            dq_f[i, j] = acc0[i, j]
                        for i, j in T.Parallel(C, K):
                            acc0[i, j] = Q_s[i, j] * acc0[i, j]
                        T.reduce_sum(acc0, red0q, dim=1)
                        for i in T.Parallel(C):
                            dgq_s[i] = red0q[i]
                        T.gemm(dP_s, K_s, dq_f)
                        store_rows(dq_f, dq_out, t0, end, hk)
                        # WY inverse: dL = -strict_lower(A^T dA A^T), dbeta's row term, dAs = dM + dM^T
                        T.gemm(A_s, Ag_s, T1_f, transpose_A=True, clear_accum=True)
                        T.copy(T1_f, T1_s)
                        T.gemm(T1_s, A_s, T2_f, transpose_B=True, clear_accum=True)
                        T.gemm(K_s, K_s, KK_f, transpose_B=True, clear_accum=True)
                        wy_inverse_grad(T2_f, KK_f, beta_s, KK_f, red0b, F_s, dbr_s, dAs_s, C, dtype)
                        T.fence_proxy_async()
                        T.named_barrier_arrive(BAR_HANDOFF, 256)  # dAs to the dk warpgroup
                    else:
                        # dk = diag(r) V' dS^T + dU S0^T + dP^T Q + dAs K, with the r-terms of dgam
                        T.gemm(Vp_s, dS_s, acc1, transpose_B=True, clear_accum=True)
                        for i, j in T.Parallel(C, K):
                            dk_f[i, j] = T.exp(gam_last - gam_s[i]) * acc1[i, j]
                        kt1_terms(K_s, acc1, gam_s, gam_last, acc1, red1, kt1_s, C, K)  # in place over acc1
                        T.gemm(dv_s, S0_s, dk_f, transpose_B=True)
                        T.gemm(dP_s, Q_s, dk_f, transpose_A=True)
                        sv_rows(S0_s, dS_s, acc1, red1s, sv_s, C, V)  # sum(S0 .* dS), for the dgam0 tail
                        T.sync_threads(BAR_HANDOFF, 256)
                        T.gemm(dAs_s, K_s, dk_f)
                        store_rows(dk_f, dk_out, t0, end, hk)
                    T.sync_threads()
                    # dgam0 = e-term - r-terms; the last real row L gets exp(gam_last) sum(S0 .* dS) +
                    # sum_{i < L} r-terms (its own r-term cancels exactly and is never formed)
                    dgam0_from_sv(sv_s, kt1_s, dgu_s, gam_last, acc_cc, redl, dgam_s, t0, end, C)
                    # dg = reverse in-chunk cumsum of dgam; dbeta
                    store_dg_dbeta(dgam_s, dgq_s, dgm_s, dbc_s, dbr_s, P_f, redg, dg_out, dbeta_out, t0, end, hv, C)
                    T.sync_threads()

    # the default merge keeps every buffer live through the loop (242 KB, over the 227 KB limit); the
    # liveness-based aggressive merge reuses them (193 KB)
    return compile_for(bwd_chunk, arch, {tilelang.PassConfigKey.TL_ENABLE_AGGRESSIVE_SHARED_MEMORY_MERGE: True})
