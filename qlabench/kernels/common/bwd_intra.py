"""The elementwise and row-sum steps of bwd_intra that do not depend on how products are issued
(TileLang macros used by hopper/bwd_chunk.py and blackwell/bwd_intra.py; the formulas are in
hopper/bwd_chunk.py's header). Parameter names match the kernels' own names on purpose: TileLang
names a buffer or variable passed to a macro after the parameter, so equal names keep the generated
CUDA readable.

The kernels' block indices (``c`` = chunk, ``hv`` = v-head, from ``T.Kernel(...) as (c, hv)``) are
TIR variables named ``bx`` and ``by``; the macros take them under those names (``bx``, ``by``) so that
passing them does not rename them either.
"""

import tilelang.language as T


@T.macro
def load_chunk(q, k, A, g_cumsum, beta, dgam0, Q_s, K_s, A_s, gam_s, beta_s, dgam_s, t0, end, hk, by,
               C: int, K: int, dtype: str):
    """Q, K, A rows of the chunk (zero past its end), gam (last row repeated), beta and dgam0."""
    for i, d in T.Parallel(C, K):
        Q_s[i, d] = T.if_then_else(t0 + i < end, q[t0 + i, hk, d], T.cast(0, dtype))
        K_s[i, d] = T.if_then_else(t0 + i < end, k[t0 + i, hk, d], T.cast(0, dtype))
    for i, j in T.Parallel(C, C):
        A_s[i, j] = T.if_then_else(t0 + i < end, A[t0 + i, by, j], T.cast(0, dtype))
    for i in T.Parallel(C):
        gam_s[i] = g_cumsum[T.min(t0 + i, end - 1), by]
        beta_s[i] = T.if_then_else(t0 + i < end, beta[t0 + i, by], 0.0)
        dgam_s[i] = T.if_then_else(t0 + i < end, dgam0[t0 + i, by], 0.0)


@T.macro
def gated_masks(P_f, dPg, dAg, A_s, gam_s, beta_s, X_s, Y_s, dA_s, dP_s, t0, end, by, scale, C: int, dtype: str):
    """X (fp32), Y = dAb .* A, dA = dAb .* beta_col and dP = scale Gam .* dPg from P = Q K^T."""
    for i, j in T.Parallel(C, C):
        decay = T.if_then_else(j <= i, T.exp(gam_s[i] - gam_s[j]), 0.0)
        dpg = T.if_then_else(t0 + i < end, dPg[t0 + i, by, j], 0.0)
        dab = decay * T.if_then_else(t0 + i < end, dAg[t0 + i, by, j], 0.0)
        X_s[i, j] = scale * decay * P_f[i, j] * dpg + dab * A_s[i, j] * beta_s[j]
        Y_s[i, j] = dab * A_s[i, j]
        dA_s[i, j] = T.cast(dab * beta_s[j], dtype)
        dP_s[i, j] = T.cast(scale * decay * dpg, dtype)


@T.macro
def mask_sums(X_s, Y_s, tmp_f, red_f, dgm_s, dbc_s, C: int):
    """dgam mask term rowsum(X) - colsum(X) and dbeta colsum(Y), all fp32 (column sums as row sums
    of the transposed shared tile)."""
    for i, j in T.Parallel(C, C):
        tmp_f[i, j] = X_s[i, j] - X_s[j, i]
    T.reduce_sum(tmp_f, red_f, dim=1)
    for i in T.Parallel(C):
        dgm_s[i] = red_f[i]
    for i, j in T.Parallel(C, C):
        tmp_f[i, j] = Y_s[j, i]
    T.reduce_sum(tmp_f, red_f, dim=1)
    for i in T.Parallel(C):
        dbc_s[i] = red_f[i]


@T.macro
def wy_inverse_grad(T2_f, KK_f, beta_s, tmp_f, red_f, dM_s, dbr_s, dAs_s, C: int, dtype: str, j0: int = 0):
    """From T2 = A^T dA A^T: dL = -strict_lower(T2), rowsum(dL .* KK) for dbeta, dM = diag(beta) dL (in T2_f,
    then ``dM_s``'s first C columns: it may be row-padded) and dAs = dM + dM^T (into columns j0 .. j0 + C - 1 of
    ``dAs_s``). ``tmp_f`` may be ``KK_f``.
    Every element-wise step writes a fragment and each tile reaches shared memory by one whole-tile copy: a
    loop that reads and writes shared memory element by element never batches its loads (the stores may
    alias them; dAs written that way held 8% of bwd_chunk's ncu samples, session 19)."""
    for i, j in T.Parallel(C, C):
        T2_f[i, j] = T.if_then_else(j < i, -T2_f[i, j], 0.0)
    for i, j in T.Parallel(C, C):
        tmp_f[i, j] = T2_f[i, j] * KK_f[i, j]
        T2_f[i, j] = beta_s[i] * T2_f[i, j]
    T.copy(T2_f, dM_s[:, 0:C])
    T.reduce_sum(tmp_f, red_f, dim=1)
    for i in T.Parallel(C):
        dbr_s[i] = red_f[i]
    for i, j in T.Parallel(C, C):
        tmp_f[i, j] = dM_s[i, j] + dM_s[j, i]
    T.copy(tmp_f, dAs_s[:, j0:j0 + C])


@T.macro
def load_dq0(dq0, Q_s, dq_f, prod_f, red_f, dgq_s, t0, end, by, C: int, K: int):
    """dq0 rows into dq_f (zero past the chunk end) and rowdot(Q, dq0) for dgam."""
    for i, j in T.Parallel(C, K):
        dq_f[i, j] = T.if_then_else(t0 + i < end, dq0[t0 + i, by, j], 0.0)
    for i, j in T.Parallel(C, K):
        prod_f[i, j] = Q_s[i, j] * dq_f[i, j]
    T.reduce_sum(prod_f, red_f, dim=1)
    for i in T.Parallel(C):
        dgq_s[i] = red_f[i]


@T.macro
def store_dg_dbeta(dgam_s, dgq_s, dgm_s, dbc_s, dbr_s, tmp_f, red_f, dg_out, dbeta_out, t0, end, by, C: int):
    """dg = reverse in-chunk cumsum of dgam0 + rowdot(Q, dq0) + mask term; dbeta = colsum + rowsum."""
    for i in T.Parallel(C):
        dgam_s[i] = dgam_s[i] + dgq_s[i] + dgm_s[i]
    for i, j in T.Parallel(C, C):
        tmp_f[i, j] = T.if_then_else(j >= i, dgam_s[j], 0.0)
    T.reduce_sum(tmp_f, red_f, dim=1)
    for i in T.Parallel(C):
        if t0 + i < end:
            dg_out[t0 + i, by] = red_f[i]
            dbeta_out[t0 + i, by] = dbc_s[i] + dbr_s[i]
