"""Forward with intra-card context parallelism (CP), built only from the existing forward kernels.

NOT YET VERIFIED ON HARDWARE and not used by the public API (`chunk_gated_delta_rule`): the next
GPU session checks it against `forward.chunk_gated_delta_rule_fwd` and the reference, measures it,
and only then wires it in. The CPU tests run this exact orchestration with float64 twins of the
kernels (`emulate_fwd.py`).

Algebra (per v-head; flashqla-design.md 1.4 and 4.4). The recurrence is affine in the state: a piece
of a sequence maps its initial state S_in to its final state as

    S_out = M S_in + S_loc,     M = prod over the piece's chunks of M_c,
                                M_c = exp(gam_C) (I - K^T A_k diag(beta) K)   (K x K)

with S_loc the piece's final state from S_in = 0. The plan (`cp.py`) cuts long sequences into
chunk-aligned pieces; chunk-aligned pieces share the sequences' chunk grid, so the cumsum and the
kkt_solve masks of the whole sequences serve the pieces unchanged.

Launches:
  (a) chunk_local_cumsum + kkt_solve over the original sequences (as forward.py).
  (b) local pass: the recurrence over the piece range of the plan's ``pass1`` (every piece that is
      not last in its sequence; pieces between them that are last in theirs run too and are ignored,
      since the kernel takes a contiguous range) from zero with store_final -> S_loc; o goes into
      the output buffer, which (d) overwrites. Transition pass: the same launch with v = 0 and
      h0 = I (V-width = K = 128) -> M (the identity-state trick of context_parallel.py).
  (c) correction, sequentially over piece positions s = 0 .. n_slots - 2, all long sequences at once:
          S_in(s + 1) = S_loc(s) + [fallback(s)] M(s) S_in(s),    S_in(0) = h0 or 0,
      one batched matmul (baddbmm into a slot view) per step, plus ~6 launches of gathers around it:
      n_slots + ~6 small launches (32 pieces: ~37). A log-depth scan over the affine maps would
      cut this to ~2 log2(n_slots) launches if it shows up in the H200 profile.
  (d) output pass: the recurrence over all pieces from S_in, o written in place; the final state of
      each sequence is its last piece's (one gather).

Warm-up truncation (``decay_threshold``, default -10). For each local-pass piece j and head h,
d(j, h) = sum of g over the piece's tokens (= the sum of its chunks' final gam). If d < threshold the
head's M(j) is dropped (treated as 0), else the head falls back to the exact M. With ||k_t||_2 = 1
and 0 <= beta_t <= 2 every factor exp(g_t) (I - beta_t k_t k_t^T) has spectral norm <= exp(g_t), so
||M(j)||_2 <= exp(d(j, h)) < e^threshold. The error e(j) = S_in_cp(j) - S_in(j) then obeys
e(j + 1) = M(j) S_in(j) (dropped) or M(j) e(j) (kept), hence for every piece of the sequence

    ||e(j)||_2 <= e^threshold * max_{i < j} ||S_in(i)||_2     (e^-10 ~ 4.5e-5)

and the same bound holds for the final state; an output row o_t = scale S_t^T q_t inside piece j
is off by at most scale ||q_t|| ||e(j)||_2 (the in-piece factors are non-expansive too). Without
normalised keys or with beta outside [0, 2] there is no such bound; ``decay_threshold=None`` keeps
every M (exact up to rounding). Unlike FlashQLA, S_loc is always computed over the whole piece (the
kernel runs one token range for all heads), so truncation only decides whether M is needed:
with ``transition="auto"`` the transition pass is skipped when no (piece, head) falls back, which
needs one host read of a flag (a sync; never inside a CUDA-graph capture, where the pass always
runs); ``transition="always"`` never syncs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .common.chunks import build_chunk_table, dense_cu_seqlens
from .common.cumsum import chunk_local_cumsum
from .cp import CPPlan, plan_cp
from .dispatch import arch_for_device, kernel_factory
from .forward import _sm_count, recurrence_kernel, value_tile
from .validate import validate

__all__ = ["ForwardKernels", "chunk_gated_delta_rule_fwd_cp"]

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float64: "float64",
                torch.float32: "float32"}
TRANSITIONS = ("auto", "always")


@dataclass(frozen=True)
class ForwardKernels:
    """The three forward kernels as forward.py calls them.

    cumsum(g2, table, C, arch_name) -> g_cumsum (common.cumsum.chunk_local_cumsum);
    kkt_solve(h_qk, h_v, K, C, dtype, arch_name) -> kernel; recurrence(n_blocks, sm_count, arch) ->
    factory(h_qk, h_v, K, V, BV, C, dtype, state_v_first, arch_name) -> kernel.
    """

    cumsum: Callable
    kkt_solve: Callable
    recurrence: Callable


def _device_kernels(arch) -> ForwardKernels:
    return ForwardKernels(chunk_local_cumsum, kernel_factory(arch, "kkt_solve"), recurrence_kernel)


def chunk_gated_delta_rule_fwd_cp(
    q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, output_final_state=True,
    state_v_first=False, plan: CPPlan | None = None, decay_threshold: float | None = -10.0,
    *, plan_heads: int | None = None, transition: str = "auto", arch=None, return_piece_states: bool = False,
):
    """`forward.chunk_gated_delta_rule_fwd` with intra-card CP (see the module docstring).

    Args: as chunk_gated_delta_rule_fwd, plus
        plan: a `cp.plan_cp` plan for these cu_seqlens (None: planned here with ``plan_heads`` or
            H_v, the device's SM count and the arch's chunk size; cached per cu_seqlens values).
        decay_threshold: negative float (drop M where a piece decays below e^threshold) or None.
        plan_heads: head count to plan with (the global one under tensor parallelism).
        transition: "auto" or "always" (see the module docstring).
        return_piece_states: also return the pieces' initial states (what `backward_cp` needs).

    Returns:
        (g_cumsum `[B, T, H_v]` fp32, A `[B, T, H_v, C]`, o `[B, T, H_v, V]`, None, final_state
        `[N, H_v, K, V]` fp32 or None): the same as chunk_gated_delta_rule_fwd without output_h;
        with ``return_piece_states`` a sixth entry, h0_pieces `[P, H_v, K, V]` fp32 (`[P, H_v, V, K]`
        with ``state_v_first``): the initial state of every piece of ``plan`` (truncated like the
        output when decay_threshold is set).
    """
    p = validate(q, k, v, g, beta, scale, initial_state, cu_seqlens, state_v_first, for_kernels=True)
    arch = arch or arch_for_device(q.device)
    sms = _sm_count(q.device)
    if plan is None:
        plan = plan_cp(cu_seqlens, heads=plan_heads or p.h_v, sm_count=sms, chunk_size=arch.chunk_size,
                       B=p.B, T=p.T, device=q.device)
    return _fwd_cp(q, k, v, g, beta, p, initial_state, cu_seqlens, output_final_state, state_v_first, plan,
                   decay_threshold, transition, _device_kernels(arch), arch, sms,
                   return_piece_states=return_piece_states)


def check_cp_arguments(p, plan, decay_threshold, transition, C: int) -> None:
    """ValueError naming the argument for a bad transition / threshold / plan, or K != V."""
    if transition not in TRANSITIONS:
        raise ValueError(f"transition must be one of {TRANSITIONS}, got {transition!r}")
    if decay_threshold is not None and not decay_threshold < 0:
        raise ValueError(f"decay_threshold must be negative or None, got {decay_threshold}")
    if p.K != p.V:
        raise ValueError(f"the transition pass needs K == V (identity start state), got K={p.K}, V={p.V}")
    if plan.chunk_size != C or plan.n_seqs != p.N:
        raise ValueError(f"plan is for chunk size {plan.chunk_size} and {plan.n_seqs} sequences; the call "
                         f"has chunk size {C} and {p.N} sequences")


def _fwd_cp(q, k, v, g, beta, p, initial_state, cu_seqlens, output_final_state, state_v_first, plan,
            decay_threshold, transition, kernels: ForwardKernels, arch, sms: int, return_piece_states=False):
    """The orchestration; ``kernels`` are the device kernels or their float64 twins."""
    C = arch.chunk_size
    check_cp_arguments(p, plan, decay_threshold, transition, C)
    dtype = _DTYPE_NAMES[q.dtype]
    dev = q.device
    BT = p.B * p.T
    H, K, V = p.h_v, p.K, p.V
    sdt = torch.float64 if q.dtype == torch.float64 else torch.float32  # fp32 (fp64 with the twins)
    q2 = q.reshape(BT, p.h_qk, K).contiguous()
    k2 = k.reshape(BT, p.h_qk, K).contiguous()
    v2 = v.reshape(BT, H, V).contiguous()
    g2 = g.reshape(BT, H).to(sdt).contiguous()
    beta2 = beta.reshape(BT, H).to(sdt).contiguous()
    cu = dense_cu_seqlens(p.B, p.T, dev) if cu_seqlens is None else cu_seqlens.to(dev, torch.int32)
    table = build_chunk_table(cu, BT, C)

    # (a) cumsum + kkt_solve over the original sequences.
    g_cumsum = kernels.cumsum(g2, table, C, arch.name)
    A, Ag, Pm = (torch.empty(BT, H, C, dtype=q.dtype, device=dev) for _ in range(3))
    kernels.kkt_solve(p.h_qk, H, K, C, dtype, arch.name)(
        q2, k2, g_cumsum, beta2, table.chunk_bounds, A, Ag, Pm, p.scale)

    state = (H, V, K) if state_v_first else (H, K, V)
    o = torch.empty(BT, H, V, dtype=q.dtype, device=dev)
    h_dummy = torch.empty((1,) + state, dtype=q.dtype, device=dev)

    def recurrence(n_pieces):
        return _recurrence(kernels, n_pieces, p, C, dtype, state_v_first, arch, sms)

    user_h0 = (initial_state.to(sdt).contiguous() if initial_state is not None
               else torch.zeros((p.N,) + state, dtype=sdt, device=dev))

    def gate_prefix(tok_hi):  # prefix sums of the raw gate: piece decay = prefix[end] - prefix[start]
        csum = torch.zeros(tok_hi + 1, H, dtype=torch.float64, device=dev)
        # scan along the contiguous dim: torch's scan over dim 0 of a [T, H] tensor is ~1000x slower
        csum[1:] = g2[:tok_hi].to(torch.float64).t().contiguous().cumsum(1).t()
        return csum

    h0_pieces = piece_initial_states(p, plan, state_v_first, q2, k2, v2, g_cumsum, Ag, Pm, user_h0, gate_prefix,
                                     decay_threshold, transition, kernels, arch, sms, o)

    # (d) output pass over all pieces.
    ht_pieces = torch.empty((plan.n_pieces if output_final_state else 1,) + state, dtype=sdt, device=dev)
    recurrence(plan.n_pieces)(q2, k2, v2, g_cumsum, Ag, Pm, plan.cu_pieces, plan.chunk_offsets, h0_pieces,
                              o, ht_pieces, h_dummy, p.scale, 1, int(bool(output_final_state)), 0)
    final = ht_pieces[plan.last_piece] if output_final_state else None
    out = (
        g_cumsum.reshape(p.B, p.T, H),
        A.reshape(p.B, p.T, H, C),
        o.reshape(p.B, p.T, H, V),
        None,
        final,
    )
    return out + (h0_pieces,) if return_piece_states else out


def _recurrence(kernels: ForwardKernels, n_pieces: int, p, C: int, dtype: str, state_v_first: bool, arch,
                sms: int):
    """The chunk-recurrence kernel for a launch over ``n_pieces`` pieces."""
    BV = value_tile(n_pieces * p.h_v, sms)
    factory = kernels.recurrence((p.V // BV) * n_pieces * p.h_v, sms, arch)
    return factory(p.h_qk, p.h_v, p.K, p.V, BV, C, dtype, state_v_first, arch.name)


def piece_initial_states(p, plan, state_v_first, q2, k2, v2, g_cumsum, Ag, Pm, user_h0, gate_prefix,
                         decay_threshold, transition, kernels: ForwardKernels, arch, sms: int, o_scratch):
    """Launches (b) and (c) of the module docstring: the initial state of every piece of ``plan``.

    Args:
        q2, k2: `[n_tok, H_qk, K]`; v2, o_scratch: `[n_tok, H_v, V]` (o_scratch's rows are overwritten
            with garbage); g_cumsum `[n_tok, H_v]`; Ag, Pm: kkt_solve's masks (bwd_prepare's Ag, Pg
            are the same tensors).
        user_h0: `[N, *state]` per-sequence initial states in the call's layout (zeros if none),
            float32 (float64 with the twins); its dtype is the dtype of the result.
        gate_prefix: tok_hi -> `[tok_hi + 1, H_v]` float64 prefix sums of the raw gate over the
            token axis (only called with a decay threshold).

    Returns:
        h0_pieces `[P, *state]` (contiguous).
    """
    dev, sdt = q2.device, user_h0.dtype
    dtype = _DTYPE_NAMES[q2.dtype]
    C = arch.chunk_size
    H, K = p.h_v, p.K
    state = tuple(user_h0.shape[1:])
    h_dummy = torch.empty((1,) + state, dtype=q2.dtype, device=dev)
    o = o_scratch

    if plan.pass1 is not None:
        lo, hi = plan.pass1
        P1 = hi - lo
        tok_hi = plan.pieces[hi - 1][1]
        views = [x[:tok_hi] for x in (q2, k2, v2, g_cumsum, Ag, Pm)]
        kernel1 = _recurrence(kernels, P1, p, C, dtype, state_v_first, arch, sms)
        # (b) local pass: S_loc of every piece in the range, from zero.
        S_loc = torch.empty((P1 + 1,) + state, dtype=sdt, device=dev)  # + a zero row for the slots
        S_loc[P1].zero_()
        no_h0 = torch.empty((1,) + state, dtype=sdt, device=dev)  # has_h0 = 0: never read (as forward.py)
        kernel1(*views, plan.pass1_cu, plan.pass1_chunk_offsets, no_h0, o[:tok_hi], S_loc, h_dummy,
                p.scale, 0, 1, 0)
        # Truncation: fallback[j, h] = the piece does not decay below e^threshold for head h.
        if decay_threshold is None:
            fallback = None
            run_m = True
        else:
            csum = gate_prefix(tok_hi)
            decay = csum[plan.piece_end] - csum[plan.piece_start]  # [P1, H]
            fallback = decay > decay_threshold
            capturing = dev.type == "cuda" and torch.cuda.is_current_stream_capturing()
            run_m = transition == "always" or capturing or bool(fallback.any())
        M = torch.zeros((P1 + 1, H, K, K), dtype=sdt, device=dev)
        if run_m:
            # Transition pass: v = 0 from h0 = I gives M (its own layout-transposed form with
            # state_v_first, which the chain below multiplies from the right).
            v_zero = torch.empty_like(v2[:tok_hi])
            v_zero[plan.pieces[lo][0]:].zero_()
            eye = torch.eye(K, dtype=sdt, device=dev).expand(P1, H, K, K).contiguous()
            views[2] = v_zero
            kernel1(*views, plan.pass1_cu, plan.pass1_chunk_offsets, eye, o[:tok_hi], M, h_dummy,
                    p.scale, 1, 1, 0)
            if fallback is not None:
                M[:P1] *= fallback[:, :, None, None].to(sdt)
        # (c) correction over piece positions, all long sequences at once.
        nl = len(plan.long_seqs)
        slots = torch.empty((plan.n_slots, nl) + state, dtype=sdt, device=dev)
        slots[0] = user_h0[plan.slot_seq]
        Ls = S_loc[plan.slot_src.reshape(-1)].reshape((plan.n_slots - 1, nl * H) + state[1:])
        Ms = M[plan.slot_src.reshape(-1)].reshape(plan.n_slots - 1, nl * H, K, K)
        for s in range(plan.n_slots - 1):
            cur = slots[s].view((nl * H,) + state[1:])
            nxt = slots[s + 1].view((nl * H,) + state[1:])
            if state_v_first:  # stored S^T: S_in^T M^T
                torch.baddbmm(Ls[s], cur, Ms[s], out=nxt)
            else:
                torch.baddbmm(Ls[s], Ms[s], cur, out=nxt)
        h0_all = torch.cat([slots.reshape((-1,) + state), user_h0], 0)
    else:
        h0_all = user_h0
    return h0_all[plan.h0_src].contiguous()
