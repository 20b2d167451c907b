"""Float64 oracle for Gated DeltaNet, written from the math. Differentiable with torch autograd.

Token recurrence per sequence and v-head (state S in R^{K x V}):

    S_t = exp(g_t) (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,     o_t = scale * S_t^T q_t

Chunked form (chunk C), FlashQLA's gate-free formulation. Per chunk, gam = in-chunk cumsum of g,
e_i = exp(gam_i), r_i = exp(gam_C - gam_i), Gam[i, j] = exp(gam_i - gam_j) for j <= i else 0:

    A_k = (I + strict_lower(diag(beta) K K^T))^{-1}                 (gate-free, never reads g)
    Ag  = Gam .* A_k .* beta_col          (= A_ref diag(beta): the gate re-applied by the mask)
    W   = V - diag(e) K S0;   Vd = Ag W                             (Vd = the new values v_new)
    O   = scale diag(e) Q S0 + (scale Gam .* Q K^T) Vd
    S1  = exp(gam_C) S0 + K^T diag(r) Vd

Formulation choices the kernels rely on:
* Partial last chunk: padded positions get g = 0 (so gam holds the last real cumulative gate and
  gam_C equals it), k = q = v = 0 and beta = 0; their outputs are dropped.
* Tokens after cu_seqlens[-1] (the padding tail) have o = 0, g_cumsum = 0 and A = 0.
* Per-chunk states h are the states at the START of each chunk, concatenated over sequences
  (sequence n contributes ceil(len_n / C) chunks, in order): `[NT, H_v, K, V]`.
* GQA: v-head h reads qk-head h // (H_v / H_qk).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .validate import Problem, validate

__all__ = [
    "ChunkIntermediates",
    "chunk_gated_delta_rule_ref",
    "chunk_intermediates_ref",
    "l2norm",
    "recurrent_gated_delta_rule_ref",
]


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(sum(x^2) + eps) over the last dimension (FlashQLA's and FLA's rule)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


@dataclass
class ChunkIntermediates:
    """What the chunked reference computes on its way, in the kernels' layouts (float64).

    Attributes:
        g_cumsum: `[B, T, H_v]` in-chunk cumulative log-gate (natural log), 0 on the padding tail.
        A: `[B, T, H_v, C]` gate-free inverse; row t holds its row of its chunk's C x C matrix.
        h: `[NT, H_v, K, V]` (`[NT, H_v, V, K]` with state_v_first) state at the start of each chunk.
        o: `[B, T, H_v, V]`.
        final_state: `[N, H_v, K, V]` (or `[N, H_v, V, K]`).
    """

    g_cumsum: torch.Tensor
    A: torch.Tensor
    h: torch.Tensor
    o: torch.Tensor
    final_state: torch.Tensor


def _prepare(q, k, v, g, beta, scale, initial_state, cu_seqlens, state_v_first, use_qk_l2norm):
    """Validates, casts to float64, flattens [B, T] and expands q, k to the v-heads."""
    p = validate(q, k, v, g, beta, scale, initial_state, cu_seqlens, state_v_first)
    f64 = torch.float64
    q, k = q.to(f64), k.to(f64)
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    BT = p.B * p.T
    q = q.reshape(BT, p.h_qk, p.K).repeat_interleave(p.group, dim=1)
    k = k.reshape(BT, p.h_qk, p.K).repeat_interleave(p.group, dim=1)
    v = v.to(f64).reshape(BT, p.h_v, p.V)
    g = g.to(f64).reshape(BT, p.h_v)
    beta = beta.to(f64).reshape(BT, p.h_v)
    if initial_state is None:
        h0 = q.new_zeros(p.N, p.h_v, p.K, p.V)
    else:
        h0 = initial_state.to(f64)
        if state_v_first:
            h0 = h0.transpose(-1, -2)
    return p, q, k, v, g, beta, h0


def _assemble(p: Problem, pieces: list[torch.Tensor], width: tuple[int, ...],
              like: torch.Tensor) -> torch.Tensor:
    """Concatenates per-sequence token blocks and zero-fills tokens outside every sequence.

    ``like`` gives dtype and device when every sequence is empty (no pieces to take them from).
    """
    end = p.seq_bounds[-1][1] if p.seq_bounds else 0
    tail = p.B * p.T - end
    if tail > 0 or not pieces:
        pieces = pieces + [like.new_zeros((tail,) + width)]
    return torch.cat(pieces, 0).reshape((p.B, p.T) + width)


def _finish_state(S: torch.Tensor, state_v_first: bool) -> torch.Tensor:
    return S.transpose(-1, -2) if state_v_first else S


def recurrent_gated_delta_rule_ref(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
    cu_seqlens=None, state_v_first=False, use_qk_l2norm_in_kernel=False,
):
    """Token-by-token Gated DeltaNet in float64.

    Args:
        q, k: `[B, T, H_qk, K]`. v: `[B, T, H_v, V]`. g, beta: `[B, T, H_v]`.
        initial_state: `[N, H_v, K, V]` (`[N, H_v, V, K]` with ``state_v_first``).
        cu_seqlens: `[N + 1]` int boundaries of packed sequences (B must be 1).

    Returns:
        (o `[B, T, H_v, V]` float64, final_state `[N, H_v, K, V]` float64 or None)
    """
    p, q, k, v, g, beta, h0 = _prepare(q, k, v, g, beta, scale, initial_state, cu_seqlens,
                                       state_v_first, use_qk_l2norm_in_kernel)
    outs, finals = [], []
    for n, (bos, eos) in enumerate(p.seq_bounds):
        S = h0[n]
        for t in range(bos, eos):
            kt, bt = k[t], beta[t][:, None, None]
            kS = torch.einsum("hk,hkv->hv", kt, S)
            S = torch.exp(g[t])[:, None, None] * (S - bt * kt[:, :, None] * kS[:, None, :])
            S = S + bt * kt[:, :, None] * v[t][:, None, :]
            outs.append(p.scale * torch.einsum("hk,hkv->hv", q[t], S)[None])
        finals.append(S)
    o = _assemble(p, outs, (p.h_v, p.V), like=v)
    final = _finish_state(torch.stack(finals), state_v_first) if output_final_state else None
    return o, final


def _chunk_sequence(q, k, v, g, beta, S, scale: float, C: int, collect: bool):
    """Chunked recurrence over one sequence. Inputs are `[L, H_v, ...]` float64; S is `[H_v, K, V]`.

    Returns (o `[L, H_v, V]`, final S, extras) with extras = (g_cumsum `[L, H_v]`,
    A `[L, H_v, C]`, h `[NC, H_v, K, V]`) when ``collect``.
    """
    L = q.shape[0]
    NC = -(-L // C)
    pad = NC * C - L

    def chunks(x):  # [L, H, *rest] -> [H, NC, C, *rest], zero padded
        x = F.pad(x, (0, 0) * (x.dim() - 1) + (0, pad)) if x.dim() > 1 else F.pad(x, (0, pad))
        x = x.reshape((NC, C) + tuple(x.shape[1:]))
        return x.movedim(2, 0)

    qc, kc, vc = chunks(q), chunks(k), chunks(v)  # [H, NC, C, D]
    gc, bc = chunks(g), chunks(beta)  # [H, NC, C]
    gam = gc.cumsum(-1)
    incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    kkt = kc @ kc.transpose(-1, -2)
    lower = torch.tril(bc[..., :, None] * kkt, -1)
    A = torch.linalg.solve_triangular(eye + lower, eye.expand_as(lower), upper=False, unitriangular=True)
    Gam = torch.exp((gam[..., :, None] - gam[..., None, :]).masked_fill(~incl, float("-inf")))
    Ag = Gam * A * bc[..., None, :]
    Pm = scale * Gam * (qc @ kc.transpose(-1, -2))
    e = torch.exp(gam)
    gC = gam[..., -1]
    r = torch.exp(gC[..., None] - gam)
    outs, hs = [], []
    for c in range(NC):
        if collect:
            hs.append(S)
        W = vc[:, c] - e[:, c, :, None] * (kc[:, c] @ S)
        Vd = Ag[:, c] @ W
        outs.append(scale * e[:, c, :, None] * (qc[:, c] @ S) + Pm[:, c] @ Vd)
        S = torch.exp(gC[:, c])[:, None, None] * S + kc[:, c].transpose(-1, -2) @ (r[:, c, :, None] * Vd)
    o = torch.stack(outs, 1).reshape(q.shape[1], NC * C, -1)[:, :L].movedim(0, 1)
    extras = None
    if collect:
        g_cumsum = gam.reshape(q.shape[1], NC * C)[:, :L].movedim(0, 1)
        A_rows = A.reshape(q.shape[1], NC * C, C)[:, :L].movedim(0, 1)
        extras = (g_cumsum, A_rows, torch.stack(hs, 0))
    return o, S, extras


def _chunk_forward(q, k, v, g, beta, scale, initial_state, cu_seqlens, state_v_first,
                   use_qk_l2norm_in_kernel, chunk_size, collect):
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    p, q, k, v, g, beta, h0 = _prepare(q, k, v, g, beta, scale, initial_state, cu_seqlens,
                                       state_v_first, use_qk_l2norm_in_kernel)
    outs, finals, gcs, As, hs = [], [], [], [], []
    for n, (bos, eos) in enumerate(p.seq_bounds):
        if eos == bos:
            finals.append(h0[n])
            continue
        o, S, extras = _chunk_sequence(q[bos:eos], k[bos:eos], v[bos:eos], g[bos:eos], beta[bos:eos],
                                       h0[n], p.scale, chunk_size, collect)
        outs.append(o)
        finals.append(S)
        if collect:
            gcs.append(extras[0])
            As.append(extras[1])
            hs.append(extras[2])
    o = _assemble(p, outs, (p.h_v, p.V), like=v)
    final = _finish_state(torch.stack(finals), state_v_first)
    if not collect:
        return o, final, None
    h = torch.cat(hs, 0) if hs else q.new_zeros(0, p.h_v, p.K, p.V)
    inter = ChunkIntermediates(
        g_cumsum=_assemble(p, gcs, (p.h_v,), like=g),
        A=_assemble(p, As, (p.h_v, chunk_size), like=k),
        h=_finish_state(h, state_v_first),
        o=o,
        final_state=final,
    )
    return o, final, inter


def chunk_gated_delta_rule_ref(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
    state_v_first=False, use_qk_l2norm_in_kernel=False, chunk_size=64,
):
    """Chunked Gated DeltaNet in float64 (FlashQLA's gate-free formulation).

    Args:
        q, k: `[B, T, H_qk, K]`. v: `[B, T, H_v, V]`. g (natural-log gate), beta: `[B, T, H_v]`.
        initial_state: `[N, H_v, K, V]` (`[N, H_v, V, K]` with ``state_v_first``).
        cu_seqlens: `[N + 1]` int boundaries of packed sequences (B must be 1).

    Returns:
        (o `[B, T, H_v, V]` float64, final_state `[N, H_v, K, V]` float64 or None)
    """
    o, final, _ = _chunk_forward(q, k, v, g, beta, scale, initial_state, cu_seqlens, state_v_first,
                                 use_qk_l2norm_in_kernel, chunk_size, collect=False)
    return o, (final if output_final_state else None)


def chunk_intermediates_ref(
    q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, state_v_first=False,
    use_qk_l2norm_in_kernel=False, chunk_size=64,
) -> ChunkIntermediates:
    """The chunked reference with its intermediates (g cumsum, gate-free A, per-chunk h)."""
    return _chunk_forward(q, k, v, g, beta, scale, initial_state, cu_seqlens, state_v_first,
                          use_qk_l2norm_in_kernel, chunk_size, collect=True)[2]
