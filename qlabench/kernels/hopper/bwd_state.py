"""bwd_state: per-chunk gradients that need the states and the full V reduction, one block per (chunk, v-head).

Formula per chunk (S0 = h[c] state at the chunk start, dS = dh[c] gradient of the state at the chunk
end, dV' and dv from bwd_dh, A = gate-free A_k, Ag = Gam .* A .* beta_col, e = exp(gam),
r = exp(gam_C - gam)):

    U   = K S0;   dU = -diag(e) dv;   W = V - diag(e) U;   V' = Ag W
    dAg = dV' W^T                      (C x C fp32, out)
    dPg = dO V'^T                      (C x C fp32, out)
    dq0 = scale diag(e) dO S0^T        (C x K fp32, out; bwd_intra adds dP K)
    T1  = V' dS^T;  dk0 = diag(r) T1 + dU S0^T          (C x K fp32, out)
    dgam0_i = rowdot(dU, U)_i - r_i rowdot(K, T1)_i, and on the last real row L also
              exp(gam_C) sum(dS .* S0) + sum_i r_i rowdot(K, T1)_i  (the gam_C terms; folding
              them onto the last real token is exact because dg is a reverse in-chunk cumsum).
              Row L's own r-term cancels exactly and is never formed (r_L = 1; its fp32 rounding,
              O(1-10) where dS = dht, used to survive in a dg of norm 1e-5 under strong decay).

Grid: (NCmax chunks, H_v); blocks of the chunk table's unused rows (start == end) do nothing.
Threads: 256 (two warpgroups; every GEMM has M = 64 and the warp policy splits N between them).
GEMMs per chunk (wgmma, smem operands, fp32 accumulate): K S0 64x128x128, Ag W 64x128x64,
dV' W^T 64x64x128, dO V'^T 64x64x128, dO S0^T 64x128x128, V' dS^T 64x128x128, dU S0^T 64x128x128.
Shared memory (bf16): K, V (then W in place), dO, dV', dv (then dU in place), V' 6 x 16 KB,
S0, dS 2 x 32 KB, A, Ag 2 x 8 KB, five C/K-vectors fp32 ~1.5 KB: ~178 KB.
scale is a runtime argument (one compiled kernel serves every scale).
Emulated step for step by ``qlabench.kernels.emulate_bwd._emu_state``.
The loads and elementwise steps that do not depend on how products are issued are TileLang macros
in common/bwd_state.py, shared with blackwell/bwd_state.py.
"""

import functools

import tilelang.language as T

from ..common.bwd_state import kt1_terms, load_chunk, store_dgam0, store_dq0, w_and_du
from .bwd_common import compile_bwd


@functools.cache
def bwd_state_kernel(h_qk: int, h_v: int, K: int, V: int, C: int, dtype: str, arch: str):
    assert K == V, "the row-dot scratch prod_f serves both C x V and C x K products"
    group = h_v // h_qk
    n_tok = T.dynamic("n_tok")
    n_chunks = T.dynamic("n_chunks")
    n_hc = T.dynamic("n_hc")

    @T.prim_func
    def bwd_state(
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
        dAg_out: T.Tensor((n_tok, h_v, C), "float32"),
        dPg_out: T.Tensor((n_tok, h_v, C), "float32"),
        dq0_out: T.Tensor((n_tok, h_v, K), "float32"),
        dk0_out: T.Tensor((n_tok, h_v, K), "float32"),
        dgam0_out: T.Tensor((n_tok, h_v), "float32"),
        scale: T.float32,
    ):
        with T.Kernel(n_chunks, h_v, threads=256) as (c, hv):
            K_s = T.alloc_shared((C, K), dtype)
            V_s = T.alloc_shared((C, V), dtype)  # V, then W = V - diag(e) U
            dO_s = T.alloc_shared((C, V), dtype)
            dVp_s = T.alloc_shared((C, V), dtype)
            dv_s = T.alloc_shared((C, V), dtype)  # dv, then dU = -diag(e) dv
            Vp_s = T.alloc_shared((C, V), dtype)
            S0_s = T.alloc_shared((K, V), dtype)
            dS_s = T.alloc_shared((K, V), dtype)
            A_s = T.alloc_shared((C, C), dtype)
            Ag_s = T.alloc_shared((C, C), dtype)
            gam_s = T.alloc_shared((C,), "float32")
            beta_s = T.alloc_shared((C,), "float32")
            dgu_s = T.alloc_shared((C,), "float32")
            kt1_s = T.alloc_shared((C,), "float32")
            ss_s = T.alloc_shared((K,), "float32")
            acc_a = T.alloc_fragment((C, V), "float32")  # U, then V', then dO S0^T
            acc_b = T.alloc_fragment((C, K), "float32")  # T1, then dk0
            acc_cc = T.alloc_fragment((C, C), "float32")  # dAg, then dPg
            prod_f = T.alloc_fragment((C, V), "float32")
            red_f = T.alloc_fragment((C,), "float32")
            gam_last = T.alloc_var("float32")
            row_sum = T.alloc_var("float32")
            ss = T.alloc_var("float32")
            kt1_sum = T.alloc_var("float32")

            t0 = chunk_bounds[c, 0]
            end = chunk_bounds[c, 1]
            hk = hv // group
            tx = T.get_thread_binding()

            if t0 < end:
                load_chunk(k, v, do, dvp, dv, A, h, dh, g_cumsum, beta, K_s, V_s, dO_s, dVp_s, dv_s, A_s, S0_s, dS_s,
                           gam_s, beta_s, Ag_s, gam_last, c, t0, end, hk, hv, C, K, V, dtype)

                # U = K S0; dgam from e inside W; then W and dU in place.
                T.gemm(K_s, S0_s, acc_a, clear_accum=True)
                w_and_du(acc_a, dv_s, V_s, gam_s, prod_f, red_f, dgu_s, C, V, dtype)

                # V' = Ag W
                T.gemm(Ag_s, V_s, acc_a, clear_accum=True)
                T.copy(acc_a, Vp_s)

                # dAg = dV' W^T, dPg = dO V'^T (fp32 out; the mask terms are formed in bwd_intra)
                T.gemm(dVp_s, V_s, acc_cc, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, C):
                    if t0 + i < end:
                        dAg_out[t0 + i, hv, j] = acc_cc[i, j]
                T.gemm(dO_s, Vp_s, acc_cc, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, C):
                    if t0 + i < end:
                        dPg_out[t0 + i, hv, j] = acc_cc[i, j]

                # dq0 = scale diag(e) dO S0^T
                T.gemm(dO_s, S0_s, acc_a, transpose_B=True, clear_accum=True)
                store_dq0(dq0_out, acc_a, gam_s, scale, t0, end, hv, C, K)

                # dk0 = diag(r) V' dS^T + dU S0^T, and the r-terms of dgam
                T.gemm(Vp_s, dS_s, acc_b, transpose_B=True, clear_accum=True)
                kt1_terms(K_s, acc_b, gam_s, gam_last, prod_f, red_f, kt1_s, C, K)
                for i, j in T.Parallel(C, K):
                    acc_b[i, j] = acc_b[i, j] * T.exp(gam_last - gam_s[i])
                T.gemm(dv_s, S0_s, acc_b, transpose_B=True)
                for i, j in T.Parallel(C, K):
                    if t0 + i < end:
                        dk0_out[t0 + i, hv, j] = acc_b[i, j]

                # sum(dS .* S0) and the chunk's last row of dgam0
                store_dgam0(S0_s, dS_s, ss_s, kt1_s, dgu_s, gam_last, row_sum, ss, kt1_sum, dgam0_out,
                            tx, t0, end, hv, C, K, V)

    return compile_bwd(bwd_state, arch)
