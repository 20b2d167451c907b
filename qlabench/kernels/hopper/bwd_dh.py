"""bwd_dh: the reverse-over-chunks state-gradient pass, one block per (sequence, v-head, V tile).

Formula per chunk, last chunk first (dS = gradient of the state at the chunk END, K x BV fp32 in
registers, starting from dht; Pg = scale Gam .* Q K^T, Ag = Gam .* A_k .* beta_col, e = exp(gam),
r = exp(gam_C - gam), Gam[i, j] = exp(gam_i - gam_j) for j <= i else 0):

    dh[c] = dS
    dV'   = diag(r) K dS + Pg^T dO           (gradient of v_new; stored for bwd_state)
    dv    = Ag^T dV'                         (the final dv: v enters only through W)
    dU    = -diag(e) dv
    dS    = exp(gam_C) dS + K^T dU + Q^T (scale diag(e) dO)
    after the first chunk: dh0 = dS (always written; the host drops it without h0)

Every term is per V column, so V tiling is exact. Rows past the sequence end load as zero
(q = k = do = 0, beta = 0) with gam clamped to the last real token.

Grid: (V / BV, N * H_v). Threads: 128, one warpgroup doing every step in order.
GEMMs per chunk (wgmma, smem operands, fp32 accumulate): Q K^T 64x64x128, K dS 64xBVx128,
Pg^T dO 64xBVx64, Ag^T dV' 64xBVx64, K^T dU 128xBVx64, Q^T eDO 128xBVx64.
Shared memory (BV = 64, bf16): Q, K 2 x 16 KB, dO 8 KB, A, Pg, Ag 3 x 8 KB, dS 16 KB, dV', dU,
eDO 3 x 8 KB, gam/beta 0.5 KB: ~97 KB.
scale is a runtime argument (one compiled kernel serves every scale).
Emulated step for step by ``qlabench.kernels.emulate_bwd._emu_dh``.
"""

import functools

import tilelang.language as T

from .bwd_common import compile_bwd


@functools.cache
def bwd_dh_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str, arch: str):
    group = h_v // h_qk
    NV = V // BV
    n_tok = T.dynamic("n_tok")
    n_cu = T.dynamic("n_cu")
    n_seq = T.dynamic("n_seq")
    n_hc = T.dynamic("n_hc")

    @T.prim_func
    def bwd_dh(
        q: T.Tensor((n_tok, h_qk, K), dtype),
        k: T.Tensor((n_tok, h_qk, K), dtype),
        do: T.Tensor((n_tok, h_v, V), dtype),
        g_cumsum: T.Tensor((n_tok, h_v), "float32"),
        beta: T.Tensor((n_tok, h_v), "float32"),
        A: T.Tensor((n_tok, h_v, C), dtype),
        cu_seqlens: T.Tensor((n_cu,), "int32"),
        chunk_offsets: T.Tensor((n_cu,), "int32"),
        dht: T.Tensor((n_seq, h_v, K, V), "float32"),
        dh_out: T.Tensor((n_hc, h_v, K, V), dtype),
        dvp_out: T.Tensor((n_tok, h_v, V), dtype),
        dv_out: T.Tensor((n_tok, h_v, V), dtype),
        dh0_out: T.Tensor((n_seq, h_v, K, V), "float32"),
        scale: T.float32,
    ):
        with T.Kernel(NV, (n_cu - 1) * h_v, threads=128) as (iv, nh):
            Q_s = T.alloc_shared((C, K), dtype)
            K_s = T.alloc_shared((C, K), dtype)
            dO_s = T.alloc_shared((C, BV), dtype)
            A_s = T.alloc_shared((C, C), dtype)
            Pg_s = T.alloc_shared((C, C), dtype)
            Ag_s = T.alloc_shared((C, C), dtype)
            dS_s = T.alloc_shared((K, BV), dtype)
            dVp_s = T.alloc_shared((C, BV), dtype)
            dU_s = T.alloc_shared((C, BV), dtype)
            eDO_s = T.alloc_shared((C, BV), dtype)
            gam_s = T.alloc_shared((C,), "float32")
            beta_s = T.alloc_shared((C,), "float32")
            dS_f = T.alloc_fragment((K, BV), "float32")
            P_f = T.alloc_fragment((C, C), "float32")
            dVp_f = T.alloc_fragment((C, BV), "float32")
            dW_f = T.alloc_fragment((C, BV), "float32")
            gam_last = T.alloc_var("float32")

            n = nh // h_v
            h = nh % h_v
            hk = h // group
            v0 = iv * BV
            bos = cu_seqlens[n]
            eos = cu_seqlens[n + 1]
            n_chunks = T.ceildiv(eos - bos, C)

            for i, j in T.Parallel(K, BV):
                dS_f[i, j] = dht[n, h, i, v0 + j]

            for cr in T.serial(n_chunks):
                c = n_chunks - 1 - cr
                t0 = bos + c * C
                for i, d in T.Parallel(C, K):
                    Q_s[i, d] = T.if_then_else(t0 + i < eos, q[t0 + i, hk, d], T.cast(0, dtype))
                    K_s[i, d] = T.if_then_else(t0 + i < eos, k[t0 + i, hk, d], T.cast(0, dtype))
                for i, j in T.Parallel(C, BV):
                    dO_s[i, j] = T.if_then_else(t0 + i < eos, do[t0 + i, h, v0 + j], T.cast(0, dtype))
                for i, j in T.Parallel(C, C):
                    A_s[i, j] = T.if_then_else(t0 + i < eos, A[t0 + i, h, j], T.cast(0, dtype))
                for i in T.Parallel(C):
                    gam_s[i] = g_cumsum[T.min(t0 + i, eos - 1), h]
                    beta_s[i] = T.if_then_else(t0 + i < eos, beta[t0 + i, h], 0.0)
                T.copy(dS_f, dS_s)
                for i, j in T.Parallel(K, BV):
                    dh_out[chunk_offsets[n] + c, h, i, v0 + j] = dS_s[i, j]
                gam_last = gam_s[C - 1]

                T.gemm(Q_s, K_s, P_f, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, C):
                    decay = T.if_then_else(j <= i, T.exp(gam_s[i] - gam_s[j]), 0.0)
                    Pg_s[i, j] = T.cast(scale * decay * P_f[i, j], dtype)
                    Ag_s[i, j] = T.cast(decay * A_s[i, j] * beta_s[j], dtype)

                T.gemm(K_s, dS_s, dVp_f, clear_accum=True)
                for i, j in T.Parallel(C, BV):
                    dVp_f[i, j] = dVp_f[i, j] * T.exp(gam_last - gam_s[i])
                T.gemm(Pg_s, dO_s, dVp_f, transpose_A=True)
                T.copy(dVp_f, dVp_s)
                for i, j in T.Parallel(C, BV):
                    if t0 + i < eos:
                        dvp_out[t0 + i, h, v0 + j] = dVp_s[i, j]

                T.gemm(Ag_s, dVp_s, dW_f, transpose_A=True, clear_accum=True)
                for i, j in T.Parallel(C, BV):
                    if t0 + i < eos:
                        dv_out[t0 + i, h, v0 + j] = T.cast(dW_f[i, j], dtype)
                for i, j in T.Parallel(C, BV):
                    dU_s[i, j] = T.cast(-T.exp(gam_s[i]) * dW_f[i, j], dtype)
                    eDO_s[i, j] = T.cast(scale * T.exp(gam_s[i]) * dO_s[i, j], dtype)

                for i, j in T.Parallel(K, BV):
                    dS_f[i, j] = dS_f[i, j] * T.exp(gam_last)
                T.gemm(K_s, dU_s, dS_f, transpose_A=True)
                T.gemm(Q_s, eDO_s, dS_f, transpose_A=True)

            for i, j in T.Parallel(K, BV):
                dh0_out[n, h, i, v0 + j] = dS_f[i, j]

    return compile_bwd(bwd_dh, arch)
