"""The loads and elementwise steps of kkt_solve around its two products and the inverse (TileLang
macros used by hopper/kkt_solve.py, which sm120 compiles as well, and by blackwell/kkt_solve.py; the
formulas are in the Hopper file's header). Parameter names match the kernels' own names on purpose:
TileLang names a buffer or variable passed to a macro after the parameter, so equal names keep the
generated code of both kernels as it was before these steps moved here. The v-head block index
(``h`` in the kernels, from ``T.Kernel(...) as (c, h)``) is the TIR variable ``by``, and the macros
take it under that name.
"""

import tilelang.language as T


@T.macro
def load_chunk(q, k, g_cumsum, beta, K_s, Q_s, b_s, gam_s, start, end, by, hk, C: int, K: int, dtype: str):
    """K, Q rows of the chunk and beta (zero past its end), gam (last row repeated)."""
    for i, d in T.Parallel(C, K):
        K_s[i, d] = T.if_then_else(start + i < end, k[start + i, hk, d], T.cast(0, dtype))
        Q_s[i, d] = T.if_then_else(start + i < end, q[start + i, hk, d], T.cast(0, dtype))
    for i in T.Parallel(C):
        b_s[i] = T.if_then_else(start + i < end, beta[start + i, by], 0.0)
        gam_s[i] = g_cumsum[T.min(start + i, end - 1), by]


@T.macro
def build_l(kkt, b_s, L_s, X_s, C: int):
    """L = strict_lower(diag(beta) K K^T) (K K^T in kkt) and X = 0, then a block barrier."""
    for i, j in T.Parallel(C, C):
        L_s[i, j] = T.if_then_else(j < i, b_s[i] * kkt[i, j], 0.0)
        X_s[i, j] = 0.0
    T.sync_threads()


@T.macro
def store_rows(tile_s, out, start, end, by, C: int):
    """The chunk's rows of a C x C shared tile to out[start + i, by, :] (a row is C contiguous elements:
    vector stores of whole 16-byte pieces, not the fragment layout's 2- or 4-byte ones)."""
    for i, j in T.Parallel(C, C):
        if start + i < end:
            out[start + i, by, j] = tile_s[i, j]


@T.macro
def store_pm(qkt, gam_s, Pm_s, Pm, scale, start, end, by, C: int, dtype: str):
    """Pm = scale Gam .* Q K^T (Q K^T in qkt) through the C x C shared tile Pm_s, the chunk's rows only."""
    for i, j in T.Parallel(C, C):
        Pm_s[i, j] = T.if_then_else(j <= i, T.cast(scale * T.exp(gam_s[i] - gam_s[j]) * qkt[i, j], dtype),
                                    T.cast(0, dtype))
    store_rows(Pm_s, Pm, start, end, by, C)


@T.macro
def store_a_ag(X_s, gam_s, b_s, A_s, Ag_s, A, Ag, start, end, by, C: int, dtype: str, store_a: bool = True):
    """A = X (the inverse) and Ag = Gam .* A .* beta_col through the C x C shared tiles A_s, Ag_s, the
    chunk's rows only; A is not written when ``store_a`` is False (a forward no backward follows: only
    the backward reads A)."""
    for i, j in T.Parallel(C, C):
        if store_a:
            A_s[i, j] = T.cast(X_s[i, j], dtype)
        Ag_s[i, j] = T.if_then_else(j <= i, T.cast(T.exp(gam_s[i] - gam_s[j]) * X_s[i, j] * b_s[j], dtype),
                                    T.cast(0, dtype))
    if store_a:
        store_rows(A_s, A, start, end, by, C)
    store_rows(Ag_s, Ag, start, end, by, C)
