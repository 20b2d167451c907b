"""Step-for-step torch emulation of the Hopper backward kernels (``hopper/bwd_*.py``).

Each ``_emu_*`` function below is one kernel body for one chunk (all v-heads at once), with the same
operand order, the same fp32-accumulator / staged-operand boundaries and the same padding rules.
With ``stage_dtype=None`` everything runs in float64 and must match ``torch.autograd`` of the float64
reference to rounding; with ``stage_dtype=torch.bfloat16`` every operand the kernels stage in bf16
(shared-memory GEMM operands, the h / dh / dv' intermediates) is rounded the same way, which predicts
the kernels' error on the CPU. A GPU test can diff each kernel against its ``_emu_*`` twin.

Per chunk (C rows, gam = in-chunk cumsum of g padded with the last real value, e = exp(gam),
r = exp(gam_C - gam), Gam[i, j] = exp(gam_i - gam_j) for j <= i else 0, S0 = state at the chunk
start, dS = gradient of the state at the chunk end, A = gate-free A_k):

    kernel bwd_prepare (one block per chunk, every chunk in parallel; ``_emu_masks``):
        Pg = scale Gam .* Q K^T;  Ag = Gam .* A .* beta_col   (bf16);  factors e, r, beta (fp32)
    kernel bwd_h (forward order, V-tiled; ``blackwell/bwd_h_pipelined.py``; ``hopper/bwd_h_ws.py`` computes
    the same states with K^T A_k diag(beta) formed first, so its bf16 staging differs):
        h[c] = S;  Y = diag(r) V - exp(gam_C) K S;  S = exp(gam_C) S + K^T (A diag(beta)) Y
    kernel bwd_dh (reverse order, V-tiled, reads Pg, Ag and the factors; ``hopper/bwd_dh_pipelined.py``):
        dh[c] = dS;  dV' = diag(r) K dS + Pg^T dO;  dv = Ag^T dV';  dU = -diag(e) dv
        dS = exp(gam_C) dS + K^T dU + Q^T (scale diag(e) dO);   after the first chunk: dh0 = dS
        (stores dh, dV'; sm100's stores dv too, sm90's bwd_chunk forms dv itself from dV', over it in place)
    kernel bwd_state (one block per chunk, full V; sm90 fuses it with bwd_intra: hopper/bwd_chunk.py):
        U = K S0;  W = V - diag(e) U;  V' = Ag W
        dAg = dV' W^T;  dPg = dO V'^T;  dq0 = scale diag(e) dO S0^T
        T1 = V' dS^T;  dk0 = diag(r) T1 + dU S0^T
        dgam0_i = rowdot(dU, U)_i - r_i rowdot(K, T1)_i
                  (+ exp(gam_C) sum(dS .* S0) + sum_i r_i rowdot(K, T1)_i on the last real row)
    kernel bwd_intra (one block per chunk):
        P = Q K^T;  dAb = Gam .* dAg;  dA = dAb .* beta_col;  dP = scale Gam .* dPg
        X = Pg .* dPg + dAb .* A .* beta_col                   (fp32 through the transpose)
        dbeta_t = colsum(dAb .* A)_t + rowsum(dL .* K K^T)_t
        dL = -strict_lower(A^T dA A^T);  dM = diag(beta) dL;  dAs = dM + dM^T
        dq = dq0 + dP K;  dk = dk0 + dP^T Q + dAs K
        dgam = dgam0 + rowdot(Q, dq0) + rowsum(X) - colsum(X);  dg = reverse in-chunk cumsum of dgam
    host: dq, dk summed over the GQA group in fp32; every gradient zero on the padding tail.
"""

from __future__ import annotations

import torch

from .common.chunks import f32_buffers
from .validate import validate

__all__ = ["KERNEL_TWINS", "SM100_TWINS", "emulate_chunk_gated_delta_rule_bwd"]

F64 = torch.float64


class _Stager:
    """Rounds a tensor to the staging dtype (identity in pure float64 mode)."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.dtype is None else x.to(self.dtype).to(F64)


def _chunk_rows(x: torch.Tensor, t0: int, end: int, C: int) -> torch.Tensor:
    """Rows t0 .. t0 + C of x `[T, H, *]`, zero past ``end``, moved to `[H, C, *]`."""
    out = x.new_zeros((C,) + tuple(x.shape[1:]))
    out[: end - t0] = x[t0:end]
    return out.movedim(0, 1)


def _chunk_gates(gcum: torch.Tensor, beta: torch.Tensor, t0: int, end: int, C: int):
    """(gam, beta, e, r, gam_C, Gam) of one chunk; gam padded with the last real value, beta with 0."""
    idx = torch.clamp(torch.arange(t0, t0 + C), max=end - 1)
    gam = gcum[idx].movedim(0, 1)  # [H, C]
    b = _chunk_rows(beta, t0, end, C)
    gC = gam[:, -1]
    e = torch.exp(gam)
    r = torch.exp(gC[:, None] - gam)
    incl = torch.ones(C, C, dtype=torch.bool).tril()
    Gam = torch.where(incl, torch.exp(gam[:, :, None] - gam[:, None, :]), torch.zeros((), dtype=F64))
    return gam, b, e, r, gC, Gam


def _t(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-1, -2)


def _emu_h(S, K_c, V_c, A_c, b, r, egC, st):
    """bwd_h, one chunk (``egC`` = exp(gam_C)). Returns (h[c] as staged, next S fp32)."""
    S_s = st(S)
    KS = K_c @ S_s
    Y_s = st(r[..., None] * V_c - egC[:, None, None] * KS)
    Ab_s = st(A_c * b[:, None, :])
    Z_s = st(Ab_s @ Y_s)
    S_next = egC[:, None, None] * S + _t(K_c) @ Z_s
    return S_s, S_next


def _emu_masks(Q_c, K_c, A_c, b, Gam, scale, st):
    """bwd_prepare's bf16 masks (Pg, Ag) of one chunk."""
    P = Q_c @ _t(K_c)
    return st(scale * Gam * P), st(Gam * A_c * b[:, None, :])


def _emu_dh(dS, Q_c, K_c, dO_c, Pg_s, Ag_s, e, r, egC, scale, st, zn=False):
    """bwd_dh, one chunk, given bwd_prepare's staged masks (``egC`` = exp(gam_C)). ``zn``: sm90's bwd_dh_ws, whose
    K^T dU is Zn^T dV' with Zn = -Ag diag(e) K (the product staged, its register operand -Ag diag(e) too);
    otherwise the pipelined kernels' K^T dU with dU = -diag(e) Ag^T dV' staged.

    Returns (dh[c] staged, dV' (fp32), dv (fp32), dS for the chunk before).
    """
    dS_s = st(dS)
    dVp = r[..., None] * (K_c @ dS_s) + _t(Pg_s) @ dO_c
    dVp_s = st(dVp)
    dW = _t(Ag_s) @ dVp_s
    eDO_s = st(scale * e[..., None] * dO_c)
    if zn:
        Zn_s = st(st(-Ag_s * e[..., None, :]) @ K_c)
        dS_prev = egC[:, None, None] * dS + _t(Zn_s) @ dVp_s + _t(Q_c) @ eDO_s
    else:
        dU_s = st(-e[..., None] * dW)
        dS_prev = egC[:, None, None] * dS + _t(K_c) @ dU_s + _t(Q_c) @ eDO_s
    return dS_s, dVp, dW, dS_prev


def _emu_state(K_c, V_c, dO_c, dVp_c, dv_c, A_c, S0, dS, b, e, r, gC, Gam, last, scale, st):
    """bwd_state, one chunk. ``dVp_c``, ``dv_c``, ``S0``, ``dS`` as stored (staged).

    Returns (dAg, dPg, dq0, dk0, dgam0), all fp32.
    """
    Ag_s = st(Gam * A_c * b[:, None, :])
    U = K_c @ S0
    dU = -e[..., None] * dv_c
    dU_s = st(dU)
    dgam_u = (dU * U).sum(-1)
    W_s = st(V_c - e[..., None] * U)
    Vp_s = st(Ag_s @ W_s)
    dAg = dVp_c @ _t(W_s)
    dPg = dO_c @ _t(Vp_s)
    dq0 = (scale * e)[..., None] * (dO_c @ _t(S0))
    T1 = Vp_s @ _t(dS)
    kt1 = r * (K_c * T1).sum(-1)
    dk0 = r[..., None] * T1 + dU_s @ _t(S0)
    # on the last real row the r-term cancels exactly: it gets the r-terms of the rows before it only
    glast = torch.exp(gC) * (dS * S0).sum((-1, -2)) + kt1[:, :last].sum(-1)
    dgam0 = dgam_u - kt1
    dgam0[:, last] = dgam_u[:, last] + glast
    return dAg, dPg, dq0, dk0, dgam0


def _emu_intra(Q_c, K_c, A_c, dAg, dPg, dq0, dk0, dgam0, b, Gam, scale, st):
    """bwd_intra, one chunk. Returns (dq, dk, dbeta, dg) fp32 for all C rows."""
    C = Q_c.shape[-2]
    P = Q_c @ _t(K_c)
    KK = K_c @ _t(K_c)
    dAb = Gam * dAg
    X = scale * Gam * P * dPg + dAb * A_c * b[:, None, :]
    Y = dAb * A_c
    dA_s = st(dAb * b[:, None, :])
    dP_s = st(scale * Gam * dPg)
    T1_s = st(_t(A_c) @ dA_s)
    strict = torch.ones(C, C, dtype=torch.bool).tril(-1)
    dL = torch.where(strict, -(T1_s @ _t(A_c)), torch.zeros((), dtype=F64))
    dbeta = _t(Y).sum(-1) + (dL * KK).sum(-1)
    dM = b[..., None] * dL
    dAs_s = st(dM + _t(dM))
    dgam = dgam0 + (Q_c * dq0).sum(-1) + (X - _t(X)).sum(-1)
    dq = dq0 + dP_s @ K_c
    dk = dk0 + _t(dP_s) @ Q_c + dAs_s @ K_c
    dg = dgam.flip(-1).cumsum(-1).flip(-1)
    return dq, dk, dbeta, dg


def emulate_chunk_gated_delta_rule_bwd(
    q, k, v, g_cumsum, beta, A, do, dht=None, scale=None, initial_state=None, cu_seqlens=None,
    state_v_first=False, chunk_size=64, stage_dtype=None,
):
    """The backward as the kernels compute it, in float64 (optionally with their bf16 staging).

    Args:
        q, k: `[B, T, H_qk, K]`. v, do: `[B, T, H_v, V]`. g_cumsum, beta: `[B, T, H_v]`.
        A: `[B, T, H_v, C]` gate-free inverse from kkt_solve (or the reference's intermediates).
        dht: `[N, H_v, K, V]` (`[N, H_v, V, K]` with ``state_v_first``) or None.
        initial_state: like dht, or None.
        stage_dtype: None (pure float64) or the dtype the kernels stage operands in.

    Returns:
        (dq, dk, dv, dbeta, dg, dh0) float64; dh0 is None without ``initial_state``.
    """
    p = validate(q, k, v, g_cumsum, beta, scale, initial_state, cu_seqlens, state_v_first)
    C = chunk_size
    if tuple(A.shape) != (p.B, p.T, p.h_v, C):
        raise ValueError(f"A must be [B, T, H_v, C] = {(p.B, p.T, p.h_v, C)}, got {tuple(A.shape)}")
    if tuple(do.shape) != (p.B, p.T, p.h_v, p.V):
        raise ValueError(f"do must be [B, T, H_v, V] = {(p.B, p.T, p.h_v, p.V)}, got {tuple(do.shape)}")
    st = _Stager(stage_dtype)
    BT, H, G = p.B * p.T, p.h_v, p.group

    def flat(x, *rest):
        return x.detach().to(F64).reshape((BT,) + rest)

    qf = flat(q, p.h_qk, p.K).repeat_interleave(G, 1)
    kf = flat(k, p.h_qk, p.K).repeat_interleave(G, 1)
    vf, dof = flat(v, H, p.V), flat(do, H, p.V)
    gf, bf, Af = flat(g_cumsum, H), flat(beta, H), flat(A, H, C)

    def state_in(x):
        if x is None:
            return torch.zeros(p.N, H, p.K, p.V, dtype=F64)
        x = x.detach().to(F64)
        return _t(x) if state_v_first else x

    h0, dht_ = state_in(initial_state), state_in(dht)

    dq = torch.zeros(BT, H, p.K, dtype=F64)
    dk = torch.zeros(BT, H, p.K, dtype=F64)
    dv = torch.zeros(BT, H, p.V, dtype=F64)
    dbeta = torch.zeros(BT, H, dtype=F64)
    dg = torch.zeros(BT, H, dtype=F64)
    dh0 = torch.zeros(p.N, H, p.K, p.V, dtype=F64)
    for n, (bos, eos) in enumerate(p.seq_bounds):
        starts = list(range(bos, eos, C))
        chunks = []
        for t0 in starts:
            end = min(t0 + C, eos)
            chunks.append({
                "t0": t0, "end": end, "Q": _chunk_rows(qf, t0, end, C), "K": _chunk_rows(kf, t0, end, C),
                "V": _chunk_rows(vf, t0, end, C), "dO": _chunk_rows(dof, t0, end, C),
                "A": _chunk_rows(Af, t0, end, C), "gates": _chunk_gates(gf, bf, t0, end, C)})
        # bwd_h: states at chunk starts (the emulated kernel stores them staged).
        S = h0[n]
        hs = []
        for ch in chunks:
            _, b, _, r, gC, _ = ch["gates"]
            S_s, S = _emu_h(S, ch["K"], ch["V"], ch["A"], b, r, torch.exp(gC), st)
            hs.append(S_s)
        # bwd_dh: reverse pass, stores dh (staged) and dV' (staged); dv = Ag^T dV' is bwd_chunk's, in fp32
        # registers for dU and the e-term (stored rounded, as the final gradient).
        dS = dht_[n]
        dhs, dvps, dvs = [None] * len(chunks), [None] * len(chunks), [None] * len(chunks)
        for i in reversed(range(len(chunks))):
            ch = chunks[i]
            _, b, e, r, gC, Gam = ch["gates"]
            Pg_s, Ag_s = _emu_masks(ch["Q"], ch["K"], ch["A"], b, Gam, p.scale, st)  # bwd_prepare
            dS_s, dVp, dW, dS = _emu_dh(dS, ch["Q"], ch["K"], ch["dO"], Pg_s, Ag_s, e, r, torch.exp(gC),
                                        p.scale, st)
            L = ch["end"] - ch["t0"]
            dhs[i] = dS_s
            dvps[i] = st(dVp) * (torch.arange(C) < L)[:, None]
            dvs[i] = dW * (torch.arange(C) < L)[:, None]
            dv[ch["t0"]:ch["end"]] = dW.movedim(0, 1)[:L]
        dh0[n] = dS
        # bwd_state + bwd_intra: independent per chunk.
        for i, ch in enumerate(chunks):
            _, b, e, r, gC, Gam = ch["gates"]
            L = ch["end"] - ch["t0"]
            dAg, dPg, dq0, dk0, dgam0 = _emu_state(ch["K"], ch["V"], ch["dO"], dvps[i], dvs[i], ch["A"],
                                                   hs[i], dhs[i], b, e, r, gC, Gam, L - 1, p.scale, st)
            dq_c, dk_c, db_c, dg_c = _emu_intra(ch["Q"], ch["K"], ch["A"], dAg, dPg, dq0, dk0, dgam0,
                                                b, Gam, p.scale, st)
            sl = slice(ch["t0"], ch["end"])
            dq[sl] = dq_c.movedim(0, 1)[:L]
            dk[sl] = dk_c.movedim(0, 1)[:L]
            dbeta[sl] = db_c.movedim(0, 1)[:L]
            dg[sl] = dg_c.movedim(0, 1)[:L]
    dq = dq.reshape(BT, p.h_qk, G, p.K).sum(2).reshape(p.B, p.T, p.h_qk, p.K)
    dk = dk.reshape(BT, p.h_qk, G, p.K).sum(2).reshape(p.B, p.T, p.h_qk, p.K)
    dv = dv.reshape(p.B, p.T, H, p.V)
    dbeta = dbeta.reshape(p.B, p.T, H)
    dg = dg.reshape(p.B, p.T, H)
    if initial_state is None:
        return dq, dk, dv, dbeta, dg, None
    return dq, dk, dv, dbeta, dg, (_t(dh0) if state_v_first else dh0)


# ---------------------------------------------------------------------------------------------
# Kernel twins: the same per-chunk math behind the exact argument lists of the compiled kernels
# (flattened token axis, chunk tables, output buffers written in place). ``backward._bwd_impl``
# runs with these on the CPU, which checks the host side (tables, layouts, indexing, GQA sums,
# padding) and each kernel's indexing without a GPU. Operands are staged in the buffers' dtype.


def _expand_heads(x: torch.Tensor, h_v: int) -> torch.Tensor:
    """`[T, H_qk, D]` -> `[T, H_v, D]` float64 (v-head h reads qk-head h // group)."""
    return x.to(F64).repeat_interleave(h_v // x.shape[1], 1)


def twin_bwd_state(k, v, do, dvp, dv, g_cumsum, beta, A, h, dh, chunk_bounds, dAg_out, dPg_out, dq0_out,
                   dk0_out, dgam0_out, scale):
    C, H = A.shape[-1], v.shape[1]
    st = _Stager(h.dtype)
    kf, vf, dof, dvpf, dvf = _expand_heads(k, H), v.to(F64), do.to(F64), dvp.to(F64), dv.to(F64)
    gf, bf, Af = g_cumsum.to(F64), beta.to(F64), A.to(F64)
    for c, (t0, end) in enumerate(chunk_bounds.tolist()):
        if t0 >= end:
            continue
        _, b, e, r, gC, Gam = _chunk_gates(gf, bf, t0, end, C)
        outs = _emu_state(_chunk_rows(kf, t0, end, C), _chunk_rows(vf, t0, end, C),
                          _chunk_rows(dof, t0, end, C), _chunk_rows(dvpf, t0, end, C),
                          _chunk_rows(dvf, t0, end, C), _chunk_rows(Af, t0, end, C), h[c].to(F64),
                          dh[c].to(F64), b, e, r, gC, Gam, end - t0 - 1, scale, st)
        for buf, x in zip((dAg_out, dPg_out, dq0_out, dk0_out, dgam0_out), outs):
            buf[t0:end] = x.movedim(0, 1)[: end - t0].to(buf.dtype)


def twin_bwd_intra(q, k, g_cumsum, beta, A, dAg, dPg, dq0, dk0, dgam0, chunk_bounds, dq_out, dk_out,
                   dbeta_out, dg_out, scale):
    C, H = A.shape[-1], A.shape[1]
    st = _Stager(q.dtype)
    qf, kf = _expand_heads(q, H), _expand_heads(k, H)
    gf, bf, Af = g_cumsum.to(F64), beta.to(F64), A.to(F64)
    for c, (t0, end) in enumerate(chunk_bounds.tolist()):
        if t0 >= end:
            continue
        _, b, _, _, _, Gam = _chunk_gates(gf, bf, t0, end, C)

        def rows(x, t0=t0, end=end):
            return _chunk_rows(x.to(F64), t0, end, C)

        outs = _emu_intra(rows(qf), rows(kf), rows(Af), rows(dAg), rows(dPg), rows(dq0), rows(dk0),
                          rows(dgam0), b, Gam, scale, st)
        for buf, x in zip((dq_out, dk_out, dbeta_out, dg_out), outs):
            buf[t0:end] = x.movedim(0, 1)[: end - t0].to(buf.dtype)


def twin_bwd_prepare(q, k, g_cumsum, beta, A, chunk_bounds, Pg_out, Ag_out, fac_out, scale):
    C, H = A.shape[-1], A.shape[1]
    st = _Stager(Pg_out.dtype)
    qf, kf = _expand_heads(q, H), _expand_heads(k, H)
    gf, bf, Af = g_cumsum.to(F64), beta.to(F64), A.to(F64)
    for c, (t0, end) in enumerate(chunk_bounds.tolist()):
        if t0 >= end:
            continue
        _, b, e, r, _, Gam = _chunk_gates(gf, bf, t0, end, C)
        Pg_s, Ag_s = _emu_masks(_chunk_rows(qf, t0, end, C), _chunk_rows(kf, t0, end, C),
                                _chunk_rows(Af, t0, end, C), b, Gam, scale, st)
        Pg_out[t0:end] = Pg_s.movedim(0, 1)[: end - t0].to(Pg_out.dtype)
        Ag_out[t0:end] = Ag_s.movedim(0, 1)[: end - t0].to(Ag_out.dtype)
        fac_out[c] = torch.stack([e, r, b], 1).to(fac_out.dtype)


def _factors(fac, ci):
    """(e, r, beta, exp(gam_C)) of chunk-table row ``ci`` from bwd_prepare's factor table."""
    f = fac[ci].to(F64)  # [H, 3, C]
    return f[:, 0], f[:, 1], f[:, 2], f[:, 0, -1]


def twin_bwd_h_pipelined(k, v, A, fac, cu_seqlens, chunk_offsets, seq_order, h0, h_out):
    C, H = A.shape[-1], v.shape[1]
    st = _Stager(h_out.dtype)
    kf, vf, Af = _expand_heads(k, H), v.to(F64), A.to(F64)
    cu, off = cu_seqlens.tolist(), chunk_offsets.tolist()
    for n in seq_order.tolist():  # the kernels' dispatch order (every sequence once)
        S = h0[n].to(F64)
        for c, t0 in enumerate(range(cu[n], cu[n + 1], C)):
            end = min(t0 + C, cu[n + 1])
            _, r, b, egC = _factors(fac, off[n] + c)
            S_s, S = _emu_h(S, _chunk_rows(kf, t0, end, C), _chunk_rows(vf, t0, end, C),
                            _chunk_rows(Af, t0, end, C), b, r, egC, st)
            h_out[off[n] + c] = S_s.to(h_out.dtype)


def twin_bwd_dh(q, k, do, Pg, Ag, fac, cu_seqlens, chunk_offsets, seq_order, chunk_skip, dht, dh_out, dvp_out,
               dh0_out, scale, has_skip):
    """sm90's reverse pass (hopper/bwd_dh_ws.py, the default; bwd_dh_pipelined.py also stores rows under has_skip):
    dh, dV', dh0; no dv (bwd_chunk forms it); under has_skip only dh0, as bwd_dh_ws."""
    twin_bwd_dh_pipelined(q, k, do, Pg, Ag, fac, cu_seqlens, chunk_offsets, seq_order, chunk_skip, dht, dh_out,
                          dvp_out, None, dh0_out, scale, has_skip, rows_with_skip=False, zn=True)


def _dh_rows(q, k, do, Pg, Ag, H):
    """The reverse pass's token rows (Q, K, dO, Pg, Ag) in float64, q and k expanded to the ``H`` v-heads (`_dh_step`)."""
    return _expand_heads(q, H), _expand_heads(k, H), do.to(F64), Pg.to(F64), Ag.to(F64)


def _dh_step(dS, rows, t0, end, row, fac, scale, st, zn=False):
    """One chunk of the reverse pass (`_emu_dh`) on token rows t0..end of ``rows`` = (Q, K, dO, Pg, Ag) float64 with
    chunk ``row``'s factors."""
    e, r, _, egC = _factors(fac, row)
    C = rows[3].shape[-1]
    return _emu_dh(dS, *(_chunk_rows(x, t0, end, C) for x in rows), e, r, egC, scale, st, zn)


def twin_bwd_dh_pipelined(q, k, do, Pg, Ag, fac, cu_seqlens, chunk_offsets, seq_order, chunk_skip, dht, dh_out,
                          dvp_out, dv_out, dh0_out, scale, has_skip, rows_with_skip=True, zn=False):
    """The reverse pass (sm100's blackwell/bwd_dh_pipelined.py; ``dv_out`` None: sm90's, `twin_bwd_dh`); with
    has_skip a (sequence, head) runs only its first m - chunk_skip[n, h] chunks, from dht at the end of the last
    of them (common/bwd_h.reverse_run); the rows of the chunks it runs are stored as without (``rows_with_skip``:
    the pipelined kernels) or not (sm90's bwd_dh_ws, `twin_bwd_dh`), those of the chunks it skips left as they
    were; ``zn``: bwd_dh_ws's rounding (`_emu_dh`)."""
    C, H = Pg.shape[-1], do.shape[1]
    st = _Stager(dh_out.dtype)
    rows = _dh_rows(q, k, do, Pg, Ag, H)
    cu, off = cu_seqlens.tolist(), chunk_offsets.tolist()
    for n in seq_order.tolist():  # the kernels' dispatch order (every sequence once)
        dS = dht[n].to(F64)
        starts = list(range(cu[n], cu[n + 1], C))
        skip = chunk_skip[n].clamp(min=0).tolist() if has_skip else [0] * H
        for c in reversed(range(len(starts))):
            run = torch.tensor([c < len(starts) - s for s in skip])  # [H]: heads that run chunk c
            if not run.any():
                continue
            t0 = starts[c]
            end = min(t0 + C, cu[n + 1])
            dS_s, dVp, dW, dS_new = _dh_step(dS, rows, t0, end, off[n] + c, fac, scale, st, zn)
            dS = torch.where(run[:, None, None], dS_new, dS)
            if has_skip and not rows_with_skip:  # sm90's bwd_dh_ws: the local passes keep only dh0
                continue
            dh_out[off[n] + c, run] = dS_s[run].to(dh_out.dtype)
            dvp_out[t0:end, run] = dVp[run].movedim(0, 1)[: end - t0].to(dvp_out.dtype)
            if dv_out is not None:
                dv_out[t0:end, run] = dW[run].movedim(0, 1)[: end - t0].to(dv_out.dtype)
        dh0_out[n] = dS.to(dh0_out.dtype)


def _dv_of_dvp(dvp, g_cumsum, beta, A, chunk_bounds, st):
    """dv = Ag^T dV' of every chunk (bwd_chunk's first product; Ag staged as the kernel forms it), float64
    `[T, H, V]`, unrounded (the kernel keeps it in fp32 registers for dU and the e-term)."""
    C = A.shape[-1]
    gf, bf, Af, dvpf = g_cumsum.to(F64), beta.to(F64), A.to(F64), dvp.to(F64)
    dv = torch.zeros(dvp.shape, dtype=F64)
    for t0, end in chunk_bounds.tolist():
        if t0 >= end:
            continue
        _, b, _, _, _, Gam = _chunk_gates(gf, bf, t0, end, C)
        Ag_s = st(Gam * _chunk_rows(Af, t0, end, C) * b[:, None, :])
        dv[t0:end] = (_t(Ag_s) @ _chunk_rows(dvpf, t0, end, C)).movedim(0, 1)[: end - t0]
    return dv


def twin_bwd_chunk(q, k, v, do, dvp_dv, g_cumsum, beta, A, h, dh, chunk_bounds, dq_out, dk_out, dbeta_out,
                   dg_out, scale):
    """hopper/bwd_chunk.py: dv = Ag^T dV' (written over dV' in ``dvp_dv``), then bwd_state and bwd_intra per
    v-head with the fp32 intermediates kept in fp32 (on chip in the kernel, through HBM in the two-kernel form:
    the same values), dq, dk summed over each GQA group in fp32 and stored once in ``dq_out``'s dtype
    (`[T, H_qk, K]`)."""
    T, H, C, K = v.shape[0], v.shape[1], A.shape[-1], k.shape[-1]
    G = H // q.shape[1]
    f32 = f32_buffers(q.dtype)  # the kernel's fp32 registers (float64 in pure float64 runs)
    dAg, dPg = torch.zeros(T, H, C, dtype=f32), torch.zeros(T, H, C, dtype=f32)
    dq0, dk0, dgam0 = torch.zeros(T, H, K, dtype=f32), torch.zeros(T, H, K, dtype=f32), torch.zeros(T, H, dtype=f32)
    dq_v, dk_v = torch.zeros(T, H, K, dtype=f32), torch.zeros(T, H, K, dtype=f32)
    dv = _dv_of_dvp(dvp_dv, g_cumsum, beta, A, chunk_bounds, _Stager(h.dtype))
    twin_bwd_state(k, v, do, dvp_dv, dv, g_cumsum, beta, A, h, dh, chunk_bounds, dAg, dPg, dq0, dk0, dgam0, scale)
    twin_bwd_intra(q, k, g_cumsum, beta, A, dAg, dPg, dq0, dk0, dgam0, chunk_bounds, dq_v, dk_v, dbeta_out,
                   dg_out, scale)
    rows = chunk_bounds[:, 1] > chunk_bounds[:, 0]
    tok = torch.zeros(T, dtype=torch.bool)
    for t0, end in chunk_bounds[rows].tolist():
        tok[t0:end] = True
    dvp_dv[tok] = dv[tok].to(dvp_dv.dtype)
    dq_out[tok] = dq_v.view(T, -1, G, K).sum(2)[tok].to(dq_out.dtype)
    dk_out[tok] = dk_v.view(T, -1, G, K).sum(2)[tok].to(dk_out.dtype)


def twin_bwd_fused(q, k, v, do, g_cumsum, beta, A, h, dht, chains, dq_out, dk_out, dv_out, dbeta_out, dg_out, dh0_out,
                   scale):
    """hopper/bwd_fused.py: per chain (bos, eos, first chunk's row of h, row n of dht / dh0) and v-head, the reverse
    pass from dht and every per-chunk gradient, as `twin_bwd_dh` then `twin_bwd_chunk` over the chains' chunks (the
    kernel's rounding points are theirs: dS and dV' staged, Pg and Ag formed in bf16 from fp32; only fp32 summation
    orders differ)."""
    T, H, C = v.shape[0], v.shape[1], A.shape[-1]
    rows = []
    for bos, eos, cbase, _ in chains.tolist():
        rows += [(cbase + c, t0, min(t0 + C, eos)) for c, t0 in enumerate(range(bos, eos, C))]
    n_rows = max((r for r, _, _ in rows), default=-1) + 1
    bounds = torch.zeros(n_rows, 2, dtype=torch.int32)
    for r, t0, end in rows:
        bounds[r] = torch.tensor([t0, end])
    Pg, Ag = torch.zeros(T, H, C, dtype=q.dtype), torch.zeros(T, H, C, dtype=q.dtype)
    fac = torch.zeros(n_rows, H, 3, C, dtype=f32_buffers(q.dtype))
    twin_bwd_prepare(q, k, g_cumsum, beta, A, bounds, Pg, Ag, fac, scale)
    st = _Stager(h.dtype)
    rows_f64 = _dh_rows(q, k, do, Pg, Ag, H)
    dh = torch.zeros(n_rows, *h.shape[1:], dtype=h.dtype)
    dvp = torch.zeros(v.shape, dtype=v.dtype)
    for bos, eos, cbase, n in chains.tolist():
        dS = dht[n].to(F64)
        starts = list(range(bos, eos, C))
        for c in reversed(range(len(starts))):
            t0, end = starts[c], min(starts[c] + C, eos)
            dS_s, dVp, _, dS = _dh_step(dS, rows_f64, t0, end, cbase + c, fac, scale, st)
            dh[cbase + c] = dS_s.to(dh.dtype)
            dvp[t0:end] = dVp.movedim(0, 1)[: end - t0].to(dvp.dtype)
        dh0_out[n] = dS.to(dh0_out.dtype)
    twin_bwd_chunk(q, k, v, do, dvp, g_cumsum, beta, A, h, dh, bounds, dq_out, dk_out, dbeta_out, dg_out, scale)
    for _, t0, end in rows:
        dv_out[t0:end] = dvp[t0:end]


# sm90's launch set (backward._kernels); sm100 runs bwd_state + bwd_intra in place of bwd_chunk
KERNEL_TWINS = {"bwd_prepare": twin_bwd_prepare, "bwd_h": twin_bwd_h_pipelined, "bwd_dh": twin_bwd_dh,
                "bwd_chunk": twin_bwd_chunk}
# sm100's kernels where they differ: bwd_dh stores dv too, bwd_state + bwd_intra in place of bwd_chunk
SM100_TWINS = {"bwd_dh": twin_bwd_dh_pipelined, "bwd_state": twin_bwd_state, "bwd_intra": twin_bwd_intra}
# bwd_dh=fused (sm90): bwd_fused in place of bwd_chunk and the final reverse pass
FUSED_TWINS = {"bwd_fused": twin_bwd_fused}
