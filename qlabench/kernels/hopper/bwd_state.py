"""bwd_state: per-chunk gradients that need the states and the full V reduction, one block per (chunk, v-head).

Formula per chunk (S0 = h[c] state at the chunk start, dS = dh[c] gradient of the state at the chunk
end, dV' and dv from bwd_dh, A = gate-free A_k, Ag = Gam .* A .* beta_col, e = exp(gam),
r = exp(gam_C - gam)):

    U   = K S0;   dU = -diag(e) dv;   W = V - diag(e) U;   V' = Ag W
    dAg = dV' W^T                      (C x C fp32, out)
    dPg = dO V'^T                      (C x C fp32, out)
    dq0 = scale diag(e) dO S0^T        (C x K fp32, out; bwd_intra adds dP K)
    T1  = V' dS^T;  dk0 = diag(r) T1 + dU S0^T          (C x K fp32, out)
    dgam0_i = rowdot(dU, U)_i - r_i rowdot(K, T1)_i, and on the last real row also
              exp(gam_C) sum(dS .* S0) + sum_i r_i rowdot(K, T1)_i  (the gam_C terms; folding
              them onto the last real token is exact because dg is a reverse in-chunk cumsum)

Grid: (NCmax chunks, H_v); blocks of the chunk table's unused rows (start == end) do nothing.
Threads: 256 (two warpgroups; every GEMM has M = 64 and the warp policy splits N between them).
GEMMs per chunk (wgmma, smem operands, fp32 accumulate): K S0 64x128x128, Ag W 64x128x64,
dV' W^T 64x64x128, dO V'^T 64x64x128, dO S0^T 64x128x128, V' dS^T 64x128x128, dU S0^T 64x128x128.
Shared memory (bf16): K, V (then W in place), dO, dV', dv (then dU in place), V' 6 x 16 KB,
S0, dS 2 x 32 KB, A, Ag 2 x 8 KB, five C/K-vectors fp32 ~1.5 KB: ~178 KB.
scale is a runtime argument (one compiled kernel serves every scale).
Emulated step for step by ``qlabench.kernels.emulate_bwd._emu_state``.
"""

import functools

import tilelang.language as T

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
                for i, d in T.Parallel(C, K):
                    K_s[i, d] = T.if_then_else(t0 + i < end, k[t0 + i, hk, d], T.cast(0, dtype))
                for i, j in T.Parallel(C, V):
                    V_s[i, j] = T.if_then_else(t0 + i < end, v[t0 + i, hv, j], T.cast(0, dtype))
                    dO_s[i, j] = T.if_then_else(t0 + i < end, do[t0 + i, hv, j], T.cast(0, dtype))
                    dVp_s[i, j] = T.if_then_else(t0 + i < end, dvp[t0 + i, hv, j], T.cast(0, dtype))
                    dv_s[i, j] = T.if_then_else(t0 + i < end, dv[t0 + i, hv, j], T.cast(0, dtype))
                for i, j in T.Parallel(C, C):
                    A_s[i, j] = T.if_then_else(t0 + i < end, A[t0 + i, hv, j], T.cast(0, dtype))
                for i, j in T.Parallel(K, V):
                    S0_s[i, j] = h[c, hv, i, j]
                    dS_s[i, j] = dh[c, hv, i, j]
                for i in T.Parallel(C):
                    gam_s[i] = g_cumsum[T.min(t0 + i, end - 1), hv]
                    beta_s[i] = T.if_then_else(t0 + i < end, beta[t0 + i, hv], 0.0)
                gam_last = gam_s[C - 1]

                for i, j in T.Parallel(C, C):
                    decay = T.if_then_else(j <= i, T.exp(gam_s[i] - gam_s[j]), 0.0)
                    Ag_s[i, j] = T.cast(decay * A_s[i, j] * beta_s[j], dtype)

                # U = K S0; dgam from e inside W; then W and dU in place.
                T.gemm(K_s, S0_s, acc_a, clear_accum=True)
                for i, j in T.Parallel(C, V):
                    prod_f[i, j] = dv_s[i, j] * acc_a[i, j]
                T.reduce_sum(prod_f, red_f, dim=1)
                for i in T.Parallel(C):
                    dgu_s[i] = -T.exp(gam_s[i]) * red_f[i]
                for i, j in T.Parallel(C, V):
                    V_s[i, j] = T.cast(V_s[i, j] - T.exp(gam_s[i]) * acc_a[i, j], dtype)
                    dv_s[i, j] = T.cast(-T.exp(gam_s[i]) * dv_s[i, j], dtype)

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
                for i, j in T.Parallel(C, K):
                    if t0 + i < end:
                        dq0_out[t0 + i, hv, j] = scale * T.exp(gam_s[i]) * acc_a[i, j]

                # dk0 = diag(r) V' dS^T + dU S0^T, and the r-terms of dgam
                T.gemm(Vp_s, dS_s, acc_b, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, K):
                    prod_f[i, j] = K_s[i, j] * acc_b[i, j]
                T.reduce_sum(prod_f, red_f, dim=1)
                for i in T.Parallel(C):
                    kt1_s[i] = T.exp(gam_last - gam_s[i]) * red_f[i]
                for i, j in T.Parallel(C, K):
                    acc_b[i, j] = acc_b[i, j] * T.exp(gam_last - gam_s[i])
                T.gemm(dv_s, S0_s, acc_b, transpose_B=True)
                for i, j in T.Parallel(C, K):
                    if t0 + i < end:
                        dk0_out[t0 + i, hv, j] = acc_b[i, j]

                # sum(dS .* S0): thread i < K sums row i, then every thread adds the K row sums.
                if tx < K:
                    row_sum = 0.0
                    for j in T.serial(V):
                        row_sum = row_sum + T.cast(S0_s[tx, j], "float32") * T.cast(dS_s[tx, j], "float32")
                    ss_s[tx] = row_sum
                T.sync_threads()
                ss = 0.0
                for i in T.serial(K):
                    ss = ss + ss_s[i]
                kt1_sum = 0.0
                for i in T.serial(C):
                    kt1_sum = kt1_sum + kt1_s[i]
                for i in T.Parallel(C):
                    if t0 + i < end:
                        dgam0_out[t0 + i, hv] = dgu_s[i] - kt1_s[i] + T.if_then_else(
                            t0 + i == end - 1, T.exp(gam_last) * ss + kt1_sum, 0.0)

    return compile_bwd(bwd_state, arch)
