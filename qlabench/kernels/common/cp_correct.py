"""cp_correct: the CP correction chain in one launch (forward: piece initial states; backward: piece
terminal gradients), instead of one batched matmul launch per piece position.

Formula. For every long sequence l, v-head h and piece position s = 0 .. n_out - 2 (a serial chain):

    X[0]     = init[l, h]
    X[s + 1] = L[j, h] + flag[j, h] * (M[j, h] X[s]),     j = src[s, l]

X, L are K x V fp32 states in the kernels' [K, V] layout, M is K x K fp32. Forward (forward_cp.py (c)):
X = the piece initial states, L = S_loc, M = the piece transitions; backward (backward_cp.py (d)):
X = the piece terminal gradients, L = dS_loc, M = the transposed transitions (bwd_dh from terminal I
stores M^T). ``flag`` = 0 where the transition was dropped by the warm-up truncation (or is not needed):
X[s + 1] = L then, and M[j, h] is never read (it may hold anything). Row j of L for a chain slot with no
piece is a zero row of the caller's table (flag 0).

Product precision. M X runs on tensor cores in bf16 with a hi / lo split of both factors
(Y = bf16(Y) + bf16(Y - bf16(Y)) for Y = M, X): M X ~ M_hi X_hi + M_hi X_lo + M_lo X_hi, three products
with fp32 accumulation; the dropped M_lo X_lo term and the rounding of the lo parts leave a relative error
of about 2^-16 per step (one bf16 product: 2^-8), so a chain of 30+ steps stays near fp32.

Grid: (V / BV, nl * H_v), one block per (V tile, long sequence, v-head) walking the chain; 128 threads
(one warpgroup: 128-row products are two m64 wgmma row blocks on sm90).
Shared memory (K = 128, BV = 32): M_hi, M_lo 2 x 32 KB + X^T hi / lo 2 x 8 KB = 80 KB (two blocks per SM).
Registers: X and the product accumulator, K x BV fp32 each: 32 + 32 per thread.
"""

import functools

import tilelang.language as T

from .build import compile_for

THREADS = 128


@functools.cache
def cp_correct_kernel(H: int, K: int, V: int, BV: int, arch: str):
    """Compiled correction chain for H v-heads, K x V states and V tiles of BV columns."""
    if V % BV:
        raise ValueError(f"V ({V}) must be a multiple of the V tile BV ({BV})")
    NV = V // BV
    n_out = T.dynamic("n_out")
    n_steps = T.dynamic("n_steps")
    n_src = T.dynamic("n_src")
    n_long = T.dynamic("n_long")

    @T.prim_func
    def cp_correct(
        init: T.Tensor((n_long, H, K, V), "float32"),
        L: T.Tensor((n_src, H, K, V), "float32"),
        M: T.Tensor((n_src, H, K, K), "float32"),
        flag: T.Tensor((n_src, H), "int32"),
        src: T.Tensor((n_steps, n_long), "int32"),
        out: T.Tensor((n_out, n_long, H, K, V), "float32"),
    ):
        with T.Kernel(NV, n_long * H, threads=THREADS) as (iv, lh):
            M_hi = T.alloc_shared((K, K), "bfloat16")
            M_lo = T.alloc_shared((K, K), "bfloat16")
            Xt_hi = T.alloc_shared((BV, K), "bfloat16")
            Xt_lo = T.alloc_shared((BV, K), "bfloat16")
            X_f = T.alloc_fragment((K, BV), "float32")
            P_f = T.alloc_fragment((K, BV), "float32")
            l = lh // H
            h = lh % H
            v0 = iv * BV
            for i, c in T.Parallel(K, BV):
                X_f[i, c] = init[l, h, i, v0 + c]
            for i, c in T.Parallel(K, BV):
                out[0, l, h, i, v0 + c] = X_f[i, c]
            for s in T.serial(n_out - 1):
                j = src[s, l]
                if flag[j, h] != 0:
                    for i, kk in T.Parallel(K, K):
                        M_hi[i, kk] = T.cast(M[j, h, i, kk], "bfloat16")
                    for i, kk in T.Parallel(K, K):
                        M_lo[i, kk] = T.cast(M[j, h, i, kk] - T.cast(T.cast(M[j, h, i, kk], "bfloat16"), "float32"),
                                             "bfloat16")
                    for i, c in T.Parallel(K, BV):
                        Xt_hi[c, i] = T.cast(X_f[i, c], "bfloat16")
                    for i, c in T.Parallel(K, BV):
                        Xt_lo[c, i] = T.cast(X_f[i, c] - T.cast(T.cast(X_f[i, c], "bfloat16"), "float32"),
                                             "bfloat16")
                    T.gemm(M_hi, Xt_hi, P_f, transpose_B=True, clear_accum=True)
                    T.gemm(M_hi, Xt_lo, P_f, transpose_B=True)
                    T.gemm(M_lo, Xt_hi, P_f, transpose_B=True)
                    for i, c in T.Parallel(K, BV):
                        X_f[i, c] = P_f[i, c] + L[j, h, i, v0 + c]
                else:
                    for i, c in T.Parallel(K, BV):
                        X_f[i, c] = L[j, h, i, v0 + c]
                for i, c in T.Parallel(K, BV):
                    out[s + 1, l, h, i, v0 + c] = X_f[i, c]

    return compile_for(cp_correct, arch)


BV_CORRECT = 32  # V tile: 4 blocks per (long sequence, v-head) at V = 128


def cp_correct(init, L, M, flag, src, out, arch: str):
    """Launches the chain (module docstring) on the device; ``out[0]`` = ``init``.

    Args: init `[n_long, H, K, V]`, L `[n_src, H, K, V]`, M `[n_src, H, K, K]` fp32 (contiguous, [K, V]
    layout); flag `[n_src, H]` int32; src `[n_out - 1, n_long]` int32 row indices into L / M / flag;
    out `[n_out, n_long, H, K, V]` fp32, written.
    """
    _, H, K, V = init.shape
    for name, x in (("init", init), ("L", L), ("M", M), ("flag", flag), ("src", src), ("out", out)):
        if not x.is_contiguous():
            raise ValueError(f"cp_correct: {name} must be contiguous, got strides {x.stride()}")
    if out.shape[0] == 1:  # no step: the chain is its start
        out[0].copy_(init)
        return out
    bv = BV_CORRECT if V % BV_CORRECT == 0 else V
    cp_correct_kernel(H, K, V, bv, arch)(init, L, M, flag, src, out)
    return out
