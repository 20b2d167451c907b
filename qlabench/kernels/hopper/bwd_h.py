"""bwd_h: recompute the per-chunk start states h for the backward, one block per (sequence, v-head, V tile).

Formula per chunk (gate-free A_k, gam = in-chunk cumsum of g clamped to the last real token,
r = exp(gam_C - gam); S is K x BV fp32 in registers):

    h[c] = S
    Y    = diag(r) V - exp(gam_C) K S          (C x BV)
    S    = exp(gam_C) S + K^T (A_k diag(beta)) Y

This is the forward's state update with diag(r) pushed through the mask (r_i Gam_ij = r_j), so no
C x C decay mask is needed. V tiling is exact (every V column has its own recurrence). Rows past
the sequence end load as k = v = 0, beta = 0.

Grid: (V / BV, N * H_v). Threads: 128, one warpgroup doing every step in order.
GEMMs per chunk (wgmma, smem operands, fp32 accumulate): K S 64xBVx128, Ab Y 64xBVx64, K^T Z 128xBVx64.
Shared memory (BV = 64, bf16): K 16 KB, V 8 KB, A, Ab 2 x 8 KB, S 16 KB, Y, Z 2 x 8 KB, gam/beta
0.5 KB: ~73 KB.
Emulated step for step by ``qlabench.kernels.emulate_bwd._emu_h``.
"""

import functools

import tilelang.language as T

from .bwd_common import compile_bwd


@functools.cache
def bwd_h_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str, arch: str):
    group = h_v // h_qk
    NV = V // BV
    n_tok = T.dynamic("n_tok")
    n_cu = T.dynamic("n_cu")
    n_seq = T.dynamic("n_seq")
    n_hc = T.dynamic("n_hc")

    @T.prim_func
    def bwd_h(
        k: T.Tensor((n_tok, h_qk, K), dtype),
        v: T.Tensor((n_tok, h_v, V), dtype),
        g_cumsum: T.Tensor((n_tok, h_v), "float32"),
        beta: T.Tensor((n_tok, h_v), "float32"),
        A: T.Tensor((n_tok, h_v, C), dtype),
        cu_seqlens: T.Tensor((n_cu,), "int32"),
        chunk_offsets: T.Tensor((n_cu,), "int32"),
        h0: T.Tensor((n_seq, h_v, K, V), "float32"),
        h_out: T.Tensor((n_hc, h_v, K, V), dtype),
    ):
        with T.Kernel(NV, (n_cu - 1) * h_v, threads=128) as (iv, nh):
            K_s = T.alloc_shared((C, K), dtype)
            V_s = T.alloc_shared((C, BV), dtype)
            A_s = T.alloc_shared((C, C), dtype)
            Ab_s = T.alloc_shared((C, C), dtype)
            S_s = T.alloc_shared((K, BV), dtype)
            Y_s = T.alloc_shared((C, BV), dtype)
            Z_s = T.alloc_shared((C, BV), dtype)
            gam_s = T.alloc_shared((C,), "float32")
            beta_s = T.alloc_shared((C,), "float32")
            S_f = T.alloc_fragment((K, BV), "float32")
            KS_f = T.alloc_fragment((C, BV), "float32")
            Z_f = T.alloc_fragment((C, BV), "float32")
            gam_last = T.alloc_var("float32")

            n = nh // h_v
            h = nh % h_v
            hk = h // group
            v0 = iv * BV
            bos = cu_seqlens[n]
            eos = cu_seqlens[n + 1]

            for i, j in T.Parallel(K, BV):
                S_f[i, j] = h0[n, h, i, v0 + j]

            for c in T.serial(T.ceildiv(eos - bos, C)):
                t0 = bos + c * C
                for i, d in T.Parallel(C, K):
                    K_s[i, d] = T.if_then_else(t0 + i < eos, k[t0 + i, hk, d], T.cast(0, dtype))
                for i, j in T.Parallel(C, BV):
                    V_s[i, j] = T.if_then_else(t0 + i < eos, v[t0 + i, h, v0 + j], T.cast(0, dtype))
                for i, j in T.Parallel(C, C):
                    A_s[i, j] = T.if_then_else(t0 + i < eos, A[t0 + i, h, j], T.cast(0, dtype))
                for i in T.Parallel(C):
                    gam_s[i] = g_cumsum[T.min(t0 + i, eos - 1), h]
                    beta_s[i] = T.if_then_else(t0 + i < eos, beta[t0 + i, h], 0.0)
                T.copy(S_f, S_s)
                for i, j in T.Parallel(K, BV):
                    h_out[chunk_offsets[n] + c, h, i, v0 + j] = S_s[i, j]
                gam_last = gam_s[C - 1]

                T.gemm(K_s, S_s, KS_f, clear_accum=True)
                for i, j in T.Parallel(C, BV):
                    Y_s[i, j] = T.cast(T.exp(gam_last - gam_s[i]) * V_s[i, j] - T.exp(gam_last) * KS_f[i, j],
                                       dtype)
                for i, j in T.Parallel(C, C):
                    Ab_s[i, j] = T.cast(A_s[i, j] * beta_s[j], dtype)
                T.gemm(Ab_s, Y_s, Z_f, clear_accum=True)
                T.copy(Z_f, Z_s)
                for i, j in T.Parallel(K, BV):
                    S_f[i, j] = S_f[i, j] * T.exp(gam_last)
                T.gemm(K_s, Z_s, S_f, transpose_A=True)

    return compile_bwd(bwd_h, arch)
