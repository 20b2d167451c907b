"""Blockwise inverse of a C x C unit lower-triangular matrix in shared memory (TileLang macros).

Used by hopper/kkt_solve.py and blackwell/kkt_solve.py (the same fp32 inverse on every arch; see
the Hopper file's header for the method and its ncu history). For X = (I + L)^{-1}, L strictly lower
triangular in ``L_s`` and ``X_s`` zeroed by the caller:
  * ``invert_diag_blocks``: each ``diag`` x ``diag`` diagonal block by forward substitution on CUDA
    cores, thread (b, c) owning column c of block b: X[i, c] = delta_ic - sum_{j<i} L[i, j] X[j, c].
  * ``merge_pairs``: one doubling level on CUDA cores: for every 2s x 2s diagonal block
    [[I + L11, 0], [L21, I + L22]] with its two s-blocks already inverted, the inverse's lower-left
    block X21 = -X22 (L21 X11), two s x s x s products through the scratch ``M_s``.
  * ``merge_32_to_64``: the last level for C = 64 as two 32 x 32 x 32 fp32 products with ``T.gemm``
    into the register fragment ``M_f`` (tf32 mma.sync on sm90 and sm100 alike).
Each macro ends with a block barrier, so its result is visible to every thread.
"""

import tilelang.language as T


@T.macro
def invert_diag_blocks(L_s, X_s, x, tx, C: int, diag: int):
    """X's ``diag`` x ``diag`` diagonal blocks (C // diag of them), one thread per (block, column):
    X[i, c] = delta_ic - sum_{j<i} L[i, j] X[j, c], j ascending.

    The thread's column lives in ``x``, the caller's ``diag``-element local buffer (registers: both
    loops are unrolled in the IR, so every index is a constant and the triangle j < i folds away); X_s
    is written once at the end, so the substitution reads no X_s and needs no barrier (it replaced a
    row-by-row version with two 64-thread barriers per row: same operations in the same order,
    bit-identical results)."""
    if tx < C:
        b0 = (tx // diag) * diag
        col = tx % diag
        for i in T.unroll(diag, explicit=True):
            x[i] = T.if_then_else(i == col, 1.0, 0.0)
            for j in T.unroll(diag, explicit=True):
                if j < i:
                    x[i] = x[i] - L_s[b0 + i, b0 + j] * x[j]
        for i in T.unroll(diag, explicit=True):
            X_s[b0 + i, b0 + col] = x[i]
    T.sync_threads()


@T.macro
def merge_pairs(L_s, X_s, M_s, tx, C: int, sz: int, threads: int):
    """X21 = -X22 (L21 X11) for every pair of inverted sz x sz diagonal blocks, on CUDA cores."""
    n_elem = (C // (2 * sz)) * sz * sz
    acc = T.alloc_var("float32")
    for e in T.serial(n_elem // threads):
        idx = e * threads + tx
        pair = idx // (sz * sz)
        r = (idx // sz) % sz
        cc = idx % sz
        top = 2 * pair * sz
        acc = 0.0
        for kk in T.unroll(sz):
            acc = acc + L_s[top + sz + r, top + kk] * X_s[top + kk, top + cc]
        M_s[pair * sz + r, cc] = acc
    T.sync_threads()
    for e in T.serial(n_elem // threads):
        idx = e * threads + tx
        pair = idx // (sz * sz)
        r = (idx // sz) % sz
        cc = idx % sz
        top = 2 * pair * sz
        acc = 0.0
        for kk in T.unroll(sz):
            acc = acc + X_s[top + sz + r, top + sz + kk] * M_s[pair * sz + kk, cc]
        X_s[top + sz + r, top + cc] = -acc
    T.sync_threads()


@T.macro
def merge_32_to_64(L_s, X_s, M_s, M_f, C: int):
    """X21 = -X22 (L21 X11) for the two 32 x 32 halves of a 64 x 64 X: two 32 x 32 x 32 fp32 (tf32)
    products on tensor cores (``T.gemm``, register accumulator ``M_f``), ``M_s`` as the staging tile."""
    half = C // 2
    T.gemm(L_s[half:C, 0:half], X_s[0:half, 0:half], M_f, clear_accum=True)
    T.copy(M_f, M_s)
    T.gemm(X_s[half:C, half:C], M_s, M_f, clear_accum=True)
    for i, j in T.Parallel(half, half):
        X_s[half + i, j] = -M_f[i, j]
    T.sync_threads()
