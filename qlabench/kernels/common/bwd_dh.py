"""The per-chunk loads and elementwise steps of bwd_dh_pipelined that do not depend on how products
are issued (TileLang macros used by hopper/bwd_dh_pipelined.py and blackwell/bwd_dh_pipelined.py,
inside their T.Pipelined chunk loops; sm90's forms no dv (bwd_chunk does), sm100's stores dv too; the
formulas are in the Hopper file's header). Parameter names match the kernels' own names on purpose:
TileLang names a buffer or variable passed to a macro after the parameter, so equal names keep the
generated CUDA of both kernels exactly as it was before these steps moved here.
"""

import tilelang.language as T


@T.macro
def load_chunk(q, k, do, Pg, Ag, fac, Q_s, K_s, dO_s, Pg_s, Ag_s, F_s, c, t0, eos, cbase, hk, h, v0,
               C: int, K: int, BV: int, dtype: str):
    """The chunk's Q, K, dO, Pg, Ag tiles and its factors; rows past the sequence end zeroed.

    The zeroing is a read-modify-write select: reading the tiles makes the pipeline wait for their
    TMA loads first (a plain store of zeros would race with the load)."""
    T.copy(q[t0:t0 + C, hk, :], Q_s)
    T.copy(k[t0:t0 + C, hk, :], K_s)
    T.copy(do[t0:t0 + C, h, v0:v0 + BV], dO_s)
    T.copy(Pg[t0:t0 + C, h, :], Pg_s)
    T.copy(Ag[t0:t0 + C, h, :], Ag_s)
    T.copy(fac[cbase + c, h, :, :], F_s)
    if t0 + C > eos:
        for i, d in T.Parallel(C, K):
            Q_s[i, d] = T.if_then_else(t0 + i < eos, Q_s[i, d], T.cast(0, dtype))
            K_s[i, d] = T.if_then_else(t0 + i < eos, K_s[i, d], T.cast(0, dtype))
        for i, j in T.Parallel(C, BV):
            dO_s[i, j] = T.if_then_else(t0 + i < eos, dO_s[i, j], T.cast(0, dtype))
        for i, j in T.Parallel(C, C):
            Pg_s[i, j] = T.if_then_else(t0 + i < eos, Pg_s[i, j], T.cast(0, dtype))
            Ag_s[i, j] = T.if_then_else(t0 + i < eos, Ag_s[i, j], T.cast(0, dtype))


@T.macro
def store_state(dS_f, dS_s, dh_out, eDO_s, F_s, dO_s, scale, c, cbase, h, v0, C: int, BV: int, dtype: str):
    """dS (bf16) into shared memory and out as this chunk's dh; eDO = scale diag(e) dO."""
    T.copy(dS_f, dS_s)
    T.copy(dS_s, dh_out[cbase + c, h, :, v0:v0 + BV])
    for i, j in T.Parallel(C, BV):
        eDO_s[i, j] = T.cast(scale * F_s[0, i] * dO_s[i, j], dtype)


@T.macro
def dw_du(dW_f, F_s, dW_s, dU_s, C: int, BV: int, dtype: str):
    """dW (= dv) and dU = -diag(e) dW, bf16, from dW = Ag^T dV' in dW_f."""
    for i, j in T.Parallel(C, BV):
        dW_s[i, j] = T.cast(dW_f[i, j], dtype)
        dU_s[i, j] = T.cast(-F_s[0, i] * dW_f[i, j], dtype)


@T.macro
def du(dW_f, F_s, dU_s, C: int, BV: int, dtype: str):
    """dU = -diag(e) dW, bf16, from dW = Ag^T dV' in dW_f (sm90: dv = dW itself is formed by bwd_chunk)."""
    for i, j in T.Parallel(C, BV):
        dU_s[i, j] = T.cast(-F_s[0, i] * dW_f[i, j], dtype)


@T.macro
def store_dvp(dVp_s, dvp_out, t0, eos, h, v0, C: int, BV: int):
    """The chunk's rows of dV' (a whole tile by T.copy when the chunk is full)."""
    if t0 + C <= eos:
        T.copy(dVp_s, dvp_out[t0:t0 + C, h, v0:v0 + BV])
    else:
        for i, j in T.Parallel(C, BV):
            if t0 + i < eos:
                dvp_out[t0 + i, h, v0 + j] = dVp_s[i, j]


@T.macro
def store_dvp_dv(dVp_s, dW_s, dvp_out, dv_out, t0, eos, h, v0, C: int, BV: int):
    """The chunk's rows of dV' and dv (whole tiles by T.copy when the chunk is full)."""
    if t0 + C <= eos:
        T.copy(dVp_s, dvp_out[t0:t0 + C, h, v0:v0 + BV])
        T.copy(dW_s, dv_out[t0:t0 + C, h, v0:v0 + BV])
    else:
        for i, j in T.Parallel(C, BV):
            if t0 + i < eos:
                dvp_out[t0 + i, h, v0 + j] = dVp_s[i, j]
                dv_out[t0 + i, h, v0 + j] = dW_s[i, j]
