"""The loads, elementwise and reduction steps of bwd_state that do not depend on how products are
issued (TileLang macros used by hopper/bwd_chunk.py and blackwell/bwd_state.py; the formulas are in
hopper/bwd_chunk.py's header). Parameter names match the kernels' own names on purpose: TileLang
names a buffer or variable passed to a macro after the parameter, so equal names keep the generated
CUDA readable.

The kernels' block indices (``c`` = chunk, ``hv`` = v-head, from ``T.Kernel(...) as (c, hv)``) are
TIR variables named ``bx`` and ``by``; the macros take them under those names (``bx``, ``by``) so that
passing them does not rename them either.
"""

import tilelang.language as T


@T.macro
def load_chunk(k, v, do, dvp, dv, A, h, dh, g_cumsum, beta, K_s, V_s, dO_s, dVp_s, dv_s, A_s, S0_s, dS_s,
               gam_s, beta_s, Ag_s, gam_last: T.Ref, bx, t0, end, hk, by, C: int, K: int, V: int, dtype: str):
    """The chunk's rows (zero past its end), its states S0 = h and dS = dh, gam (last row repeated),
    beta, gam_last, and Ag = Gam .* A .* beta_col (bf16)."""
    for i, d in T.Parallel(C, K):
        K_s[i, d] = T.if_then_else(t0 + i < end, k[t0 + i, hk, d], T.cast(0, dtype))
    for i, j in T.Parallel(C, V):
        V_s[i, j] = T.if_then_else(t0 + i < end, v[t0 + i, by, j], T.cast(0, dtype))
        dO_s[i, j] = T.if_then_else(t0 + i < end, do[t0 + i, by, j], T.cast(0, dtype))
        dVp_s[i, j] = T.if_then_else(t0 + i < end, dvp[t0 + i, by, j], T.cast(0, dtype))
        dv_s[i, j] = T.if_then_else(t0 + i < end, dv[t0 + i, by, j], T.cast(0, dtype))
    for i, j in T.Parallel(C, C):
        A_s[i, j] = T.if_then_else(t0 + i < end, A[t0 + i, by, j], T.cast(0, dtype))
    for i, j in T.Parallel(K, V):
        S0_s[i, j] = h[bx, by, i, j]
        dS_s[i, j] = dh[bx, by, i, j]
    for i in T.Parallel(C):
        gam_s[i] = g_cumsum[T.min(t0 + i, end - 1), by]
        beta_s[i] = T.if_then_else(t0 + i < end, beta[t0 + i, by], 0.0)
    gam_last = gam_s[C - 1]  # noqa: F841 (a store into the caller's T.alloc_var)

    for i, j in T.Parallel(C, C):
        decay = T.if_then_else(j <= i, T.exp(gam_s[i] - gam_s[j]), 0.0)
        Ag_s[i, j] = T.cast(decay * A_s[i, j] * beta_s[j], dtype)


@T.macro
def w_and_du(acc_a, dv_s, V_s, gam_s, prod_f, red_f, dgu_s, C: int, V: int, dtype: str):
    """From U = K S0 in acc_a: dgam's e-term -e .* rowdot(dv, U), then W = V - diag(e) U and
    dU = -diag(e) dv in place of V_s and dv_s."""
    for i, j in T.Parallel(C, V):
        prod_f[i, j] = dv_s[i, j] * acc_a[i, j]
    T.reduce_sum(prod_f, red_f, dim=1)
    for i in T.Parallel(C):
        dgu_s[i] = -T.exp(gam_s[i]) * red_f[i]
    for i, j in T.Parallel(C, V):
        V_s[i, j] = T.cast(V_s[i, j] - T.exp(gam_s[i]) * acc_a[i, j], dtype)
        dv_s[i, j] = T.cast(-T.exp(gam_s[i]) * dv_s[i, j], dtype)


@T.macro
def store_dq0(dq0_out, acc_a, gam_s, scale, t0, end, by, C: int, K: int):
    """dq0 = scale diag(e) dO S0^T (dO S0^T in acc_a), rows of the chunk only."""
    for i, j in T.Parallel(C, K):
        if t0 + i < end:
            dq0_out[t0 + i, by, j] = scale * T.exp(gam_s[i]) * acc_a[i, j]


@T.macro
def kt1_terms(K_s, acc_b, gam_s, gam_last: T.Ref, prod_f, red_f, kt1_s, C: int, K: int):
    """The r-terms of dgam from T1 = V' dS^T in acc_b: r .* rowdot(K, T1)."""
    for i, j in T.Parallel(C, K):
        prod_f[i, j] = K_s[i, j] * acc_b[i, j]
    T.reduce_sum(prod_f, red_f, dim=1)
    for i in T.Parallel(C):
        kt1_s[i] = T.exp(gam_last - gam_s[i]) * red_f[i]


@T.macro
def store_dgam0(S0_s, dS_s, ss_s, kt1_s, dgu_s, gam_last: T.Ref, row_sum: T.Ref, ss: T.Ref, kt1_sum: T.Ref, dgam0_out,
                tx, t0, end, by, C: int, K: int, V: int):
    """dgam0 = e-term - r-terms, plus exp(gam_last) sum(dS .* S0) + sum(r-terms) on the chunk's last
    real row L. On row L the r-term cancels exactly (-kt1_L + kt1_L), so it is never formed: row L gets
    exp(gam_last) sum(dS .* S0) + sum_{i < L} kt1_i. Adding and subtracting kt1_L (O(1-10) where
    dS = dht) left its fp32 rounding in a dg whose true norm can be 1e-5 under strong decay.
    sum(dS .* S0): thread i < K sums row i, then every thread adds the K row sums."""
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
        kt1_sum = kt1_sum + T.if_then_else(t0 + i < end - 1, kt1_s[i], 0.0)
    for i in T.Parallel(C):
        if t0 + i < end:
            dgam0_out[t0 + i, by] = dgu_s[i] + T.if_then_else(
                t0 + i == end - 1, T.exp(gam_last) * ss + kt1_sum, -kt1_s[i])
