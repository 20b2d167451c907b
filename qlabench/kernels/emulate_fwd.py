"""Float64 torch twins of the three forward kernels, with the kernels' exact argument lists.

They let the orchestration code that drives the kernels (``forward_cp.py``) run on the CPU: each
twin writes the same output buffers the kernel writes, rows the kernel leaves alone stay untouched,
and the math is the reference's (``reference.py``) in float64 (whatever the buffer dtypes; results
are cast to them on store). Used by tests/kernels/test_forward_cp.py.

    chunk_local_cumsum(g, table, C, arch, reverse=False, out=None)   (common/cumsum.py's wrapper)
    kkt_solve_kernel(h_qk, h_v, K, C, dtype, arch)(q, k, g_cumsum, beta, chunk_bounds, A, Ag, Pm, scale)
    chunk_fwd_kernel(h_qk, h_v, K, V, BV, C, dtype, state_v_first, arch)(
        q, k, v, g_cumsum, Ag, Pm, cu_seqlens, chunk_offsets, seq_order, chunk_skip, h0, o, ht, h_out,
        scale, has_h0, store_final, store_h, has_skip)
    cp_correct(init, L, M, flag, src, out, arch)                      (common/cp_correct.py)

Kernel behaviour reproduced: per-chunk rows past the sequence end read as zero, gam clamped to the
sequence's last token, o written only inside [cu[n], cu[n+1]), the padding tail after cu[-1] zeroed,
final state / per-chunk h written only when their flags are set, V tiling (exact) ignored; with
has_skip, (sequence n, head h) starts at chunk max(chunk_skip[n, h], 0) of its sequence (rows of o and
h of the skipped chunks untouched, h rows indexed by the chunk's index in the sequence).
"""

from __future__ import annotations

import torch

from .emulate_bwd import _chunk_gates, _chunk_rows, _expand_heads

__all__ = ["TWIN_KERNELS", "twin_chunk_fwd_kernel", "twin_chunk_local_cumsum", "twin_cp_correct",
           "twin_kkt_solve_kernel"]

F64 = torch.float64


def twin_chunk_local_cumsum(g, table, C: int, arch: str, reverse: bool = False, out=None):
    """In-chunk cumsum of g `[n_tok, H]` over the chunks of ``table`` (tail left as in ``out``)."""
    if out is None:
        out = torch.zeros_like(g)
    for t0, end in table.chunk_bounds.tolist():
        if t0 >= end:
            continue
        x = g[t0:end].to(F64)
        cs = x.flip(0).cumsum(0).flip(0) if reverse else x.cumsum(0)
        out[t0:end] = cs.to(out.dtype)
    return out


def twin_kkt_solve_kernel(h_qk: int, h_v: int, K: int, C: int, dtype: str, arch: str, store_a: bool = True):
    def kkt_solve(q, k, g_cumsum, beta, chunk_bounds, A, Ag, Pm, scale):
        qf, kf = _expand_heads(q, h_v), _expand_heads(k, h_v)
        gf, bf = g_cumsum.to(F64), beta.to(F64)
        eye = torch.eye(C, dtype=F64)
        for t0, end in chunk_bounds.tolist():
            if t0 >= end:
                continue
            _, b, _, _, _, Gam = _chunk_gates(gf, bf, t0, end, C)
            Q_c, K_c = _chunk_rows(qf, t0, end, C), _chunk_rows(kf, t0, end, C)
            lower = torch.tril(b[:, :, None] * (K_c @ K_c.transpose(-1, -2)), -1)
            A_k = torch.linalg.solve_triangular(eye + lower, eye.expand_as(lower), upper=False,
                                                unitriangular=True)
            n = end - t0
            if store_a:
                A[t0:end] = A_k.movedim(0, 1)[:n].to(A.dtype)
            Ag[t0:end] = (Gam * A_k * b[:, None, :]).movedim(0, 1)[:n].to(Ag.dtype)
            Pm[t0:end] = (scale * Gam * (Q_c @ K_c.transpose(-1, -2))).movedim(0, 1)[:n].to(Pm.dtype)

    return kkt_solve


def twin_chunk_fwd_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str,
                          state_v_first: bool, arch: str):
    def chunk_fwd(q, k, v, g_cumsum, Ag, Pm, cu_seqlens, chunk_offsets, seq_order, chunk_skip, h0, o, ht, h_out,
                  scale, has_h0, store_final, store_h, has_skip):
        n_tok = q.shape[0]
        assert all(x.shape[0] == n_tok for x in (k, v, g_cumsum, Ag, Pm, o)), "n_tok differs"
        qf, kf, vf = _expand_heads(q, h_v), _expand_heads(k, h_v), v.to(F64)
        if has_h0 == 2:  # the transition mode: start from the identity, V read as zero
            vf = torch.zeros_like(vf)
        gf, Agf, Pmf = g_cumsum.to(F64), Ag.to(F64), Pm.to(F64)
        beta_dummy = torch.zeros_like(gf)
        cu, off = cu_seqlens.tolist(), chunk_offsets.tolist()
        n_seq = len(cu) - 1
        if has_skip:
            assert tuple(chunk_skip.shape) == (n_seq, h_v) and chunk_skip.dtype == torch.int32, "chunk_skip"
            skips = chunk_skip.clamp(min=0).tolist()
        else:
            assert chunk_skip.dim() == 2 and chunk_skip.shape[1] == h_v, "chunk_skip dummy must be [*, h_v]"
            skips = [[0] * h_v for _ in range(n_seq)]
        order = seq_order.tolist()[:n_seq]  # the grid's N rows read its first N entries
        assert sorted(order) == list(range(n_seq)), "seq_order's first N entries must list every sequence once"
        for n in order:  # the kernels' dispatch order
            bos, eos = cu[n], cu[n + 1]
            skip = torch.tensor(skips[n])  # [H]: first chunk of each head
            if has_h0 == 2:
                S = torch.eye(K, V, dtype=F64).expand(h_v, K, V).clone()
            elif has_h0:
                S = h0[n].to(F64)
                S = S.transpose(-1, -2) if state_v_first else S
            else:
                S = torch.zeros(h_v, K, V, dtype=F64)
            for c, t0 in enumerate(range(bos, eos, C)):
                act = c >= skip  # [H]: heads that run this chunk
                if not bool(act.any()):
                    continue
                end = min(t0 + C, eos)
                _, _, e, r, gC, _ = _chunk_gates(gf, beta_dummy, t0, end, C)
                if store_h:
                    S_st = S.transpose(-1, -2) if state_v_first else S
                    h_out[off[n] + c, act] = S_st[act].to(h_out.dtype)
                K_c, Q_c, V_c = (_chunk_rows(x, t0, end, C) for x in (kf, qf, vf))
                Ag_c = _chunk_rows(Agf, t0, end, C)
                Pm_c = _chunk_rows(Pmf, t0, end, C)
                W = V_c - e[..., None] * (K_c @ S)
                Vd = Ag_c @ W
                O = scale * e[..., None] * (Q_c @ S) + Pm_c @ Vd
                o[t0:end, act] = O.movedim(0, 1)[: end - t0, act].to(o.dtype)
                S_next = torch.exp(gC)[:, None, None] * S + K_c.transpose(-1, -2) @ (r[..., None] * Vd)
                S = torch.where(act[:, None, None], S_next, S)
            if store_final:
                ht[n] = (S.transpose(-1, -2) if state_v_first else S).to(ht.dtype)
        if len(cu) > 1:
            o[cu[-1]:] = 0
    return chunk_fwd


def _twin_recurrence(n_blocks: int, sm_count: int, arch, bv: int | None = None):
    return twin_chunk_fwd_kernel


def twin_cp_correct(init, L, M, flag, src, out, arch: str, *, msrc=None, transpose_m: bool = False,
                    out_rows=None, init_rows=None):
    """common/cp_correct.cp_correct in float64: X[0] = init[init_rows] (init itself without init_rows),
    X[s + 1] = L[j] + flag[m] * (M[m] X[s]),
    j = src[s], m = msrc[s] (or j), M^T with ``transpose_m``; M a tensor or a (hi, lo) pair summed in float64
    (per long sequence and head; M rows with flag 0 are never read, as in the kernel); X[s] into out[s], or with
    ``out_rows`` into the rows out_rows[s] of a flat out."""
    if isinstance(M, tuple):
        M = M[0].to(F64) + M[1].to(F64)

    def put(s, x):
        if out_rows is None:
            out[s] = x.to(out.dtype)
        else:
            out[out_rows[s].long()] = x.to(out.dtype)

    x = (init if init_rows is None else init[init_rows.long()]).to(F64)
    put(0, x)
    for s in range(src.shape[0]):
        j = src[s].long()  # [n_long]
        m = j if msrc is None else msrc[s].long()
        on = (flag[m] != 0)[..., None, None]  # [n_long, H, 1, 1]
        Mm = M[m].to(F64)
        if transpose_m:
            Mm = Mm.transpose(-1, -2)
        prod = torch.where(on, Mm, torch.zeros((), dtype=F64)) @ x
        x = L[j].to(F64) + torch.where(on, prod, torch.zeros((), dtype=F64))
        put(s + 1, x)
    return out


# The ForwardKernels bundle of forward_cp (built lazily there to keep this module import-light).
TWIN_KERNELS = {"cumsum": twin_chunk_local_cumsum, "kkt_solve": twin_kkt_solve_kernel,
                "recurrence": _twin_recurrence, "correct": twin_cp_correct}
