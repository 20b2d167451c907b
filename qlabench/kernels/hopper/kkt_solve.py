"""kkt_solve: the gate-free inverse of one chunk, per (chunk, v-head).

Formula: A_k = (I + strict_lower(diag(beta) K K^T))^{-1}   (C x C, unit lower triangular).
It never reads the gate; the forward and backward re-apply it with the mask Gam.

Grid: (NCmax chunks, H_v); blocks past the real chunk count exit. Threads: 128 (one warpgroup).
  * K K^T on tensor cores (wgmma 64x64x128, fp32 accumulate); rows past the chunk end are zero.
  * Forward substitution in fp32 on CUDA cores: thread c owns column c of the inverse and walks the
    rows, X[i, c] = delta_ic - sum_{j<i} L[i, j] X[j, c]. A column depends only on itself, so the
    walk needs no barrier.
  * Rows of the chunk are stored as bf16 (row t of A holds token t's row of its chunk).
Shared memory: K 64x128 bf16 (16 KB) + L and X 64x64 fp32 (32 KB) + beta = ~48 KB.
"""

import functools

import tilelang.language as T

from ..common.build import compile_for


@functools.lru_cache(maxsize=None)
def kkt_solve_kernel(h_qk: int, h_v: int, K: int, C: int, dtype: str, arch: str):
    group = h_v // h_qk
    n_tok = T.dynamic("n_tok")
    n_chunks = T.dynamic("n_chunks")

    @T.prim_func
    def kkt_solve(
        k: T.Tensor((n_tok, h_qk, K), dtype),
        beta: T.Tensor((n_tok, h_v), "float32"),
        chunk_bounds: T.Tensor((n_chunks, 2), "int32"),
        A: T.Tensor((n_tok, h_v, C), dtype),
    ):
        with T.Kernel(n_chunks, h_v, threads=128) as (c, h):
            K_s = T.alloc_shared((C, K), dtype)
            b_s = T.alloc_shared((C,), "float32")
            L_s = T.alloc_shared((C, C), "float32")
            X_s = T.alloc_shared((C, C), "float32")
            kkt = T.alloc_fragment((C, C), "float32")
            acc = T.alloc_var("float32")
            tx = T.get_thread_binding()
            start = chunk_bounds[c, 0]
            end = chunk_bounds[c, 1]
            hk = h // group
            if end > start:
                for i, d in T.Parallel(C, K):
                    K_s[i, d] = T.if_then_else(start + i < end, k[start + i, hk, d], T.cast(0, dtype))
                for i in T.Parallel(C):
                    b_s[i] = T.if_then_else(start + i < end, beta[start + i, h], 0.0)
                T.gemm(K_s, K_s, kkt, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, C):
                    L_s[i, j] = T.if_then_else(j < i, b_s[i] * kkt[i, j], 0.0)
                T.sync_threads()
                if tx < C:
                    for i in T.serial(C):
                        acc = T.if_then_else(i == tx, 1.0, 0.0)
                        for j in T.serial(i):
                            acc = acc - L_s[i, j] * X_s[j, tx]
                        X_s[i, tx] = acc
                T.sync_threads()
                for i, j in T.Parallel(C, C):
                    if start + i < end:
                        A[start + i, h, j] = T.cast(X_s[i, j], dtype)

    return compile_for(kkt_solve, arch)
