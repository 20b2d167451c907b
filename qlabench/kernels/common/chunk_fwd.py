"""The loads and elementwise steps of the forward chunk recurrence that do not depend on how products
are issued (TileLang macros used by hopper/chunk_fwd.py, which sm120 compiles as well, and by
blackwell/chunk_fwd.py, inside their chunk loops; the formulas are in the Hopper file's header).
``W`` is the width of the V tile a block computes: BV on Hopper, the 64-column window MW on sm100.
Parameter names match the kernels' own names on purpose: TileLang names a buffer or variable passed
to a macro after the parameter, so equal names keep the generated CUDA of both kernels exactly as it
was before these steps moved here.
"""

import tilelang.language as T


def rows(t0, eos, i, value, dtype: str):
    """value on rows of the sequence; zero past its end, where whole-tile loads hold other data."""
    return T.if_then_else(t0 + i < eos, value, T.cast(0, dtype))


def start_state(h0, has_h0, n, h, v0, i, j, state_v_first: bool):
    """Element (i, v0 + j) of the start state: h0's (fp32, either layout) when has_h0 == 1, zero when 0,
    the identity when 2 (the transition mode: the CP transition pass, which also reads V as zero)."""
    stored = h0[n, h, v0 + j, i] if state_v_first else h0[n, h, i, v0 + j]
    return T.if_then_else(has_h0 == 2, T.if_then_else(i == v0 + j, 1.0, 0.0),
                          T.if_then_else(has_h0 != 0, stored, 0.0))


def value_rows(V_s, has_h0, i, j):
    """V's element, or zero in the transition mode (has_h0 == 2)."""
    return T.if_then_else(has_h0 == 2, T.cast(0, V_s.dtype), V_s[i, j])


@T.macro
def load_state(S_f, h0, has_h0, n, h, v0, K: int, W: int, state_v_first: bool):
    """The start state into registers (``start_state``)."""
    for i, j in T.Parallel(K, W):
        S_f[i, j] = start_state(h0, has_h0, n, h, v0, i, j, state_v_first)


@T.macro
def load_chunk(q, k, v, Ag, Pm, g_cumsum, Q_s, K_s, V_s, Ag_s, P_s, gam_s, t0, eos, h, hk, v0, C: int, W: int):
    """Whole tiles [t0, t0 + C) of Q, K, V, Ag, Pm, and gam clamped to the sequence's last token."""
    T.copy(q[t0:t0 + C, hk, :], Q_s)
    T.copy(k[t0:t0 + C, hk, :], K_s)
    T.copy(v[t0:t0 + C, h, v0:v0 + W], V_s)
    T.copy(Ag[t0:t0 + C, h, :], Ag_s)
    T.copy(Pm[t0:t0 + C, h, :], P_s)
    for i in T.Parallel(C):
        gam_s[i] = g_cumsum[T.min(t0 + i, eos - 1), h]


@T.macro
def form_w(V_s, U_f, gam_s, W_s, has_h0, t0, eos, C: int, W: int, dtype: str):
    """W = V - diag(e) U (U = K S in U_f), zero past the sequence end; V read as zero in the transition
    mode (has_h0 == 2)."""
    for i, j in T.Parallel(C, W):
        W_s[i, j] = rows(t0, eos, i, T.cast(value_rows(V_s, has_h0, i, j) - T.exp(gam_s[i]) * U_f[i, j], dtype),
                         dtype)


@T.macro
def form_vd_vr(U_f, gam_s, gam_last: T.Ref, Vd_s, Vr_s, K_s, t0, eos, C: int, K: int, W: int, dtype: str):
    """Vd = Ag W (in U_f) and Vr = diag(r) Vd as bf16, zero past the sequence end; on a partial chunk
    K's padded rows are zeroed before the state update K^T Vr."""
    for i, j in T.Parallel(C, W):
        Vd_s[i, j] = rows(t0, eos, i, T.cast(U_f[i, j], dtype), dtype)
        Vr_s[i, j] = rows(t0, eos, i, T.cast(T.exp(gam_last - gam_s[i]) * U_f[i, j], dtype), dtype)
    if t0 + C > eos:
        for i, d in T.Parallel(C, K):
            if t0 + i >= eos:
                K_s[i, d] = T.cast(0, dtype)
