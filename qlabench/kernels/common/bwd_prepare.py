"""The loads and the masking / store step of bwd_prepare that do not depend on how the Q K^T
product is issued (TileLang macros used by hopper/bwd_prepare.py and blackwell/bwd_prepare.py; the
formulas are in the Hopper file's header). Parameter names match the kernels' own names on purpose:
TileLang names a buffer or variable passed to a macro after the parameter, so equal names keep the
generated CUDA of both kernels exactly as it was before these steps moved here.

The kernels' block indices (``c`` = chunk, ``hv`` = v-head, from ``T.Kernel(...) as (c, hv)``) are
TIR variables named ``bx`` and ``by``; the macros take them under those names (``bx``, ``by``) so that
passing them does not rename them either.
"""

import tilelang.language as T

from .kkt_solve import mask_pm


@T.macro
def load_gates(g_cumsum, beta, gam_s, beta_s, t0, end, by, C: int):
    """v-head ``by``'s gam over the chunk (last real row repeated) and beta (zero past the end)."""
    for i in T.Parallel(C):
        gam_s[i] = g_cumsum[T.min(t0 + i, end - 1), by]
        beta_s[i] = T.if_then_else(t0 + i < end, beta[t0 + i, by], 0.0)


@T.macro
def load_chunk(q, k, A, g_cumsum, beta, Q_s, K_s, A_s, gam_s, beta_s, t0, end, hk, by, C: int):
    """Q, K, A tiles of the chunk (T.copy), gam (last row repeated) and beta (zero past the end)."""
    T.copy(q[t0:t0 + C, hk, :], Q_s)
    T.copy(k[t0:t0 + C, hk, :], K_s)
    T.copy(A[t0:t0 + C, by, :], A_s)
    load_gates(g_cumsum, beta, gam_s, beta_s, t0, end, by, C)


@T.macro
def store_masks(P_f, Ag_f, A_s, gam_s, beta_s, Pg_s, Ag_s, Pg_out, Ag_out, fac_out, scale, bx, t0, end, by, C: int,
                dtype: str):
    """Pg = scale Gam .* P (P = Q K^T in the fragment P_f, masked in place), Ag = Gam .* A .* beta_col
    (formed in the C x C fp32 fragment Ag_f), both copied to their shared tiles as a whole (stmatrix
    into the kernels' swizzled tiles: the element-wise bf16 stores from the fragment layout put eight
    rows of one column in one bank), the per-row factors exp(gam), exp(gam_last - gam), beta, and the
    chunk's rows of Pg and Ag."""
    for i, j in T.Parallel(C, C):
        decay = T.exp(gam_s[i] - gam_s[j])
        Ag_f[i, j] = T.if_then_else(j <= i, decay * A_s[i, j] * beta_s[j], 0.0)
        P_f[i, j] = T.if_then_else(j <= i, scale * decay * P_f[i, j], 0.0)
    T.copy(P_f, Pg_s)
    T.copy(Ag_f, Ag_s)
    store_factors(gam_s, beta_s, fac_out, bx, by, C)

    if t0 + C <= end:
        T.copy(Pg_s, Pg_out[t0:t0 + C, by, :])
        T.copy(Ag_s, Ag_out[t0:t0 + C, by, :])
    else:
        for i, j in T.Parallel(C, C):
            if t0 + i < end:
                Pg_out[t0 + i, by, j] = Pg_s[i, j]
                Ag_out[t0 + i, by, j] = Ag_s[i, j]



@T.macro
def store_factors(gam_s, beta_s, fac_out, bx, by, C: int):
    """The chunk's per-row factors exp(gam), exp(gam_last - gam), beta."""
    for i in T.Parallel(C):
        fac_out[bx, by, 0, i] = T.exp(gam_s[i])
        fac_out[bx, by, 1, i] = T.exp(gam_s[C - 1] - gam_s[i])
        fac_out[bx, by, 2, i] = beta_s[i]


@T.macro
def store_pg(P_f, gam_s, beta_s, Pg_s, Pg_out, fac_out, scale, bx, t0, end, by, C: int):
    """store_masks without Ag (the forward's kkt_solve wrote it): Pg = scale Gam .* P (kkt_solve's mask_pm: the
    same mask kkt_solve applied to its Pm), masked in place on P_f, copied whole to Pg_s, its chunk rows and the
    factors stored."""
    mask_pm(P_f, gam_s, scale, C)
    T.copy(P_f, Pg_s)
    store_factors(gam_s, beta_s, fac_out, bx, by, C)
    if t0 + C <= end:
        T.copy(Pg_s, Pg_out[t0:t0 + C, by, :])
    else:
        for i, j in T.Parallel(C, C):
            if t0 + i < end:
                Pg_out[t0 + i, by, j] = Pg_s[i, j]
