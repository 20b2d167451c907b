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
    """L = strict_lower(diag(beta) K K^T), masked in place on the fragment ``kkt`` (K K^T) and copied to
    L_s whole, and X = 0 (vector fills), then a block barrier. The element-wise form wrote both fp32 tiles
    as 4-byte scalars from the fragment layout, a quarter of the kernel's shared-memory wavefronts."""
    for i, j in T.Parallel(C, C):
        kkt[i, j] = T.if_then_else(j < i, b_s[i] * kkt[i, j], 0.0)
    T.copy(kkt, L_s)
    T.fill(X_s, 0.0)
    T.sync_threads()


@T.macro
def store_rows(tile_s, out, start, end, by, C: int):
    """The chunk's rows of a C x C shared tile to out[start + i, by, :] (a row is C contiguous elements:
    vector stores of whole 16-byte pieces, not the fragment layout's 2- or 4-byte ones)."""
    for i, j in T.Parallel(C, C):
        if start + i < end:
            out[start + i, by, j] = tile_s[i, j]


@T.macro
def mask_pm(qkt, gam_s, scale, C: int):
    """Pm = scale Gam .* Q K^T in place on the C x C fragment ``qkt`` (Q K^T); a select, so entries j > i
    (rows of K past a chunk's end among them) are zero whatever they held. Also the BV-128 recurrence's
    output warpgroup (hopper/chunk_fwd_roles.py, pm_on_chip)."""
    for i, j in T.Parallel(C, C):
        qkt[i, j] = T.if_then_else(j <= i, scale * T.exp(gam_s[i] - gam_s[j]) * qkt[i, j], 0.0)


@T.macro
def store_pm(qkt, gam_s, Pm_s, Pm, scale, start, end, by, C: int, dtype: str):
    """Pm = scale Gam .* Q K^T, masked in place on the fragment ``qkt`` (Q K^T) and copied to the C x C
    shared tile Pm_s as a whole (stmatrix into the kernels' swizzled stage tile), the chunk's rows only."""
    mask_pm(qkt, gam_s, scale, C)
    T.copy(qkt, Pm_s)
    store_rows(Pm_s, Pm, start, end, by, C)


@T.macro
def store_a_ag(X_s, gam_s, b_s, frag, A_s, Ag_s, A, Ag, start, end, by, C: int, dtype: str, store_a: bool = True):
    """A = X (the inverse) and Ag = Gam .* A .* beta_col, formed on the C x C fp32 fragment ``frag`` (a
    dead product fragment: the kernels pass Q K^T's, whose layout stmatrix stores) and copied to the C x C
    shared tiles A_s, Ag_s as a whole, the chunk's rows only; A is not written when ``store_a`` is False
    (a forward no backward follows: only the backward reads A)."""
    if store_a:
        for i, j in T.Parallel(C, C):
            A_s[i, j] = T.cast(X_s[i, j], dtype)
    for i, j in T.Parallel(C, C):
        frag[i, j] = T.if_then_else(j <= i, T.exp(gam_s[i] - gam_s[j]) * X_s[i, j] * b_s[j], 0.0)
    T.copy(frag, Ag_s)
    if store_a:
        store_rows(A_s, A, start, end, by, C)
    store_rows(Ag_s, Ag, start, end, by, C)

