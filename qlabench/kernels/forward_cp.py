"""Forward with intra-card context parallelism (CP), built only from the existing forward kernels.

The public API (`chunk_gated_delta_rule`) runs it when KernelOptions.cp (QLABENCH_CP) and the plan
turn CP on. tests/kernels/test_forward_cp_gpu.py checks it on the GPU against
`forward.chunk_gated_delta_rule_fwd` and the float64 reference; the CPU tests run this exact
orchestration with float64 twins of the kernels (`emulate_fwd.py`).

Algebra (per v-head; flashqla-design.md 1.4 and 4.4). The recurrence is affine in the state: a piece
of a sequence maps its initial state S_in to its final state as

    S_out = M S_in + S_loc,     M = prod over the piece's chunks of M_c,
                                M_c = exp(gam_C) (I - K^T A_k diag(beta) K)   (K x K)

with S_loc the piece's final state from S_in = 0. The plan (`cp.py`) cuts long sequences into
chunk-aligned pieces; chunk-aligned pieces share the sequences' chunk grid, so the cumsum and the
kkt_solve masks of the whole sequences serve the pieces unchanged.

Launches:
  (a) chunk_local_cumsum + kkt_solve over the original sequences (as forward.py).
  (b) warm-up tables (one launch of common/cp_tables.py, no host sync; ``warmup_tables`` is their torch
      form, which the float64 twins run): for every piece j of the plan's
      ``pass1`` range and head h, walking the piece's chunks back from its end and summing their total
      log-decays gam_C (g_cumsum at each chunk's last token), n(j, h) = the first count at which the
      sum drops below ``decay_threshold``; if it never does (or with decay_threshold None) the head
      falls back: n = all m_j chunks of the piece, and its transition M is needed.
      Local pass: the recurrence over the range from zero with store_final, each (piece, head)
      block starting at chunk m_j - n(j, h) (the kernel's chunk_skip) -> S_loc, the piece's final
      state from zero at the start of its last n(j, h) chunks (the whole piece for fallback
      heads). o goes into the output buffer, which (d) overwrites. Pieces of the range that are last
      in their sequence (the kernel takes a contiguous range; their result is not read) skip all
      their chunks. Transition pass: the same launch in the transition mode (has_h0 = 2: h0 = I, V read as
      zero; V-width = K = 128) ->
      M (the identity-state trick of context_parallel.py), run only by the fallback (piece, head)
      blocks (the others skip every chunk; their M rows are never read).
  (c) correction, sequentially over piece positions s = 0 .. n_slots - 2, all long sequences at once:
          S_in(s + 1) = S_loc(s) + [fallback(s)] M(s) S_in(s),    S_in(0) = h0 or 0,
      one launch of common/cp_correct.py (the chain inside the kernel; M read only where a head falls
      back), plus a gather of h0 and, with state_v_first, transposes around it.
  (d) output pass: the recurrence over all pieces from S_in, o written in place; the final state of
      each sequence is its last piece's (one gather).
Work: the local pass runs n(j, h) chunks per (piece, head) (~4 with the suite's bench gates, about
-3 per chunk) instead of the whole piece, the transition pass only the fallback heads' pieces (e.g.
the bench gates' zero-gate heads); the output pass stays a full pass.

Warm-up truncation (``decay_threshold``, default -10; FlashQLA's approximation, flashqla-design.md
4.3). For a truncated (piece j, head h) let Z(j) be the exact state at the start of the piece's last
n chunks (from the exact S_in(j)) and M_w the transition of those n chunks. The exact end state is
S_in(j + 1) = M_w Z(j) + S_w(j), with S_w the warm-up state from zero over the n chunks, which is
what the local pass computes; CP drops M_w Z(j), i.e. everything the piece carried in before its
warm-up window (S_in(j) through M, and the piece's own earlier chunks). With ||k_t||_2 = 1,
0 <= beta_t <= 2 and g_t <= 0 every token factor exp(g_t) (I - beta_t k_t k_t^T) has spectral norm
<= exp(g_t) <= 1, so ||M_w||_2 <= exp(sum of the window's gam_C) < e^threshold. The error e(j) = S_in_cp(j) - S_in(j)
obeys e(j + 1) = -M_w Z(j) (truncated) or M(j) e(j) (fallback, ||M(j)||_2 <= 1), hence for every
piece of the sequence

    ||e(j)||_2 <= e^threshold * max ||Z(i)||_2 over pieces i < j
               <= e^threshold * max ||S_t||_2 over the sequence's exact chunk-start states
                                                                              (e^-10 ~ 4.5e-5)

and the same bound holds for the final state; an output row o_t = scale S_t^T q_t inside piece j
is off by at most scale ||q_t|| ||e(j)||_2 (the in-piece factors are non-expansive too). Without
normalised keys or with beta outside [0, 2] there is no such bound; ``decay_threshold=None`` makes
every head fall back (the whole piece and M: exact up to rounding). With ``transition="auto"`` the
transition pass is skipped when no (piece, head) falls back, which needs one host read of a flag
(a sync; never inside a CUDA-graph capture, where the pass always runs); ``transition="always"``
never syncs (the pass then runs, doing work only for fallback heads).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .common.chunks import chunk_table, f32_buffers
from .common.cp_correct import cp_correct, split_m
from .common.cp_tables import cp_tables
from .common.cumsum import chunk_local_cumsum
from .cp import CPPlan, plan_cp
from .dispatch import arch_for_device, kernel_factory
from .forward import KktMasks, _sm_count, recurrence_kernel, solve_chunks
from .validate import validate
from .value_tile import FORWARD_STEP_US, chain_chunks, value_tile

__all__ = ["ForwardKernels", "chunk_gated_delta_rule_fwd_cp"]

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float64: "float64",
                torch.float32: "float32"}
TRANSITIONS = ("auto", "always")


@dataclass(frozen=True)
class ForwardKernels:
    """The three forward kernels as forward.py calls them.

    cumsum(g2, table, C, arch_name) -> g_cumsum (common.cumsum.chunk_local_cumsum);
    kkt_solve(h_qk, h_v, K, C, dtype, arch_name) -> kernel; recurrence(n_blocks, sm_count, arch, bv=BV) ->
    factory(h_qk, h_v, K, V, BV, C, dtype, state_v_first, arch_name) -> kernel;
    correct(init, L, M, flag, src, out, arch_name): the correction chain (common/cp_correct.cp_correct);
    tables(plan, g_cumsum, decay_threshold, arch_name) -> (skip_local, skip_m, flag): the warm-up tables
    (common/cp_tables.cp_tables; None: ``warmup_tables``, their torch form, which the twins use);
    split(M, arch_name) -> (M_hi, M_lo): the transitions' bf16 split that ``correct`` reads, done once and
    kept in `PieceTransitions` for the backward's chain (common/cp_correct.split_m; None: M as it is).
    """

    cumsum: Callable
    kkt_solve: Callable
    recurrence: Callable
    correct: Callable
    tables: Callable | None = None
    split: Callable | None = None


def _device_kernels(arch, fwd_kernel: str | None = None) -> ForwardKernels:
    """The device kernels; ``fwd_kernel`` (KernelOptions.fwd_kernel) picks the recurrence (None: the
    QLABENCH_FWD_KERNEL switch, read at each launch)."""
    recurrence = (recurrence_kernel if fwd_kernel is None
                  else functools.partial(recurrence_kernel, fwd_kernel=fwd_kernel))
    return ForwardKernels(chunk_local_cumsum, kernel_factory(arch, "kkt_solve"), recurrence, cp_correct, cp_tables,
                          split_m)


def chunk_gated_delta_rule_fwd_cp(
    q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, output_final_state=True,
    state_v_first=False, plan: CPPlan | None = None, decay_threshold: float | None = -10.0,
    *, plan_heads: int | None = None, transition: str = "auto", arch=None, return_piece_states: bool = False,
    options=None, keep_a: bool = True, return_masks: bool = False,
):
    """`forward.chunk_gated_delta_rule_fwd` with intra-card CP (see the module docstring).

    Args: as chunk_gated_delta_rule_fwd, plus
        plan: a `cp.plan_cp` plan for these cu_seqlens (None: planned here with ``plan_heads`` or
            H_v, the device's SM count and the arch's chunk size; cached per cu_seqlens values).
        decay_threshold: negative float (per piece and head, run only the last chunks whose decay
            passes below e^threshold, and drop M there; the module docstring's bound) or None (exact).
        plan_heads: head count to plan with (the global one under tensor parallelism).
        transition: "auto" or "always" (see the module docstring).
        return_piece_states: also return the pieces' initial states (what `backward_cp` needs).
        options: `options.KernelOptions` (its ``fwd_kernel`` picks the recurrence); None: the
            QLABENCH_FWD_KERNEL switch.

    Returns:
        (g_cumsum `[B, T, H_v]` fp32, A `[B, T, H_v, C]`, o `[B, T, H_v, V]`, None, final_state
        `[N, H_v, K, V]` fp32 or None): the same as chunk_gated_delta_rule_fwd without output_h;
        with ``return_piece_states`` a sixth entry, h0_pieces `[P, H_v, K, V]` fp32 (`[P, H_v, V, K]`
        with ``state_v_first``): the initial state of every piece of ``plan`` (truncated like the
        output when decay_threshold is set), and a seventh, the `PieceTransitions` of the chain (or
        None when no piece was cut): backward_cp reuses them instead of its own transition pass.
        With ``return_masks`` a last entry, kkt_solve's Ag and Pm (`forward.KktMasks`, for the backward's
        bwd_prepare, as chunk_gated_delta_rule_fwd's).
    """
    p = validate(q, k, v, g, beta, scale, initial_state, cu_seqlens, state_v_first, for_kernels=True)
    arch = arch or arch_for_device(q.device)
    sms = _sm_count(q.device)
    if plan is None:
        plan = plan_cp(cu_seqlens, heads=plan_heads or p.h_v, sm_count=sms, chunk_size=arch.chunk_size,
                       B=p.B, T=p.T, device=q.device)
    return _fwd_cp(q, k, v, g, beta, p, initial_state, cu_seqlens, output_final_state, state_v_first, plan,
                   decay_threshold, transition,
                   _device_kernels(arch, None if options is None else options.fwd_kernel), arch, sms,
                   return_piece_states=return_piece_states, keep_a=keep_a, return_masks=return_masks)


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
            decay_threshold, transition, kernels: ForwardKernels, arch, sms: int, return_piece_states=False,
            keep_a: bool = True, return_masks: bool = False):
    """The orchestration; ``kernels`` are the device kernels or their float64 twins."""
    C = arch.chunk_size
    check_cp_arguments(p, plan, decay_threshold, transition, C)
    dtype = _DTYPE_NAMES[q.dtype]
    dev = q.device
    BT = p.B * p.T
    H, K, V = p.h_v, p.K, p.V
    sdt = f32_buffers(q.dtype)
    q2 = q.reshape(BT, p.h_qk, K).contiguous()
    k2 = k.reshape(BT, p.h_qk, K).contiguous()
    v2 = v.reshape(BT, H, V).contiguous()
    g2 = g.reshape(BT, H).to(sdt).contiguous()
    beta2 = beta.reshape(BT, H).to(sdt).contiguous()
    table = chunk_table(cu_seqlens, p.seq_bounds, p.B, p.T, C, dev)

    # (a) cumsum + kkt_solve over the original sequences.
    g_cumsum = kernels.cumsum(g2, table, C, arch.name)
    A, Ag, Pm = solve_chunks(kernels.kkt_solve(p.h_qk, H, K, C, dtype, arch.name, keep_a), q2, k2, g_cumsum, beta2,
                             table.chunk_bounds, C, p.scale, keep_a)

    state = (H, V, K) if state_v_first else (H, K, V)
    o = torch.empty(BT, H, V, dtype=q.dtype, device=dev)
    h_dummy = torch.empty((1,) + state, dtype=q.dtype, device=dev)

    user_h0 = (initial_state.to(sdt).contiguous() if initial_state is not None
               else torch.zeros((p.N,) + state, dtype=sdt, device=dev))

    h0_pieces, transitions = piece_initial_states(p, plan, state_v_first, q2, k2, v2, g_cumsum, Ag, Pm, user_h0,
                                                  decay_threshold, transition, kernels, arch, sms, o)

    # (d) output pass over all pieces.
    ht_pieces = torch.empty((plan.n_pieces if output_final_state else 1,) + state, dtype=sdt, device=dev)
    no_skip = torch.empty(1, H, dtype=torch.int32, device=dev)  # has_skip = 0: never read
    kernel = _recurrence(kernels, plan.pieces, p, C, dtype, state_v_first, arch, sms)
    kernel(q2, k2, v2, g_cumsum, Ag, Pm, plan.cu_pieces, plan.chunk_offsets, plan.piece_order, no_skip, h0_pieces, o,
           ht_pieces, h_dummy, p.scale, 1, int(bool(output_final_state)), 0, 0)
    final = ht_pieces[plan.last_piece] if output_final_state else None
    out = (
        g_cumsum.reshape(p.B, p.T, H),
        None if A is None else A.reshape(p.B, p.T, H, C),
        o.reshape(p.B, p.T, H, V),
        None,
        final,
    )
    if return_piece_states:
        out += (h0_pieces, transitions)
    return out + (KktMasks(Ag, Pm),) if return_masks else out


def _recurrence(kernels: ForwardKernels, pieces, p, C: int, dtype: str, state_v_first: bool, arch, sms: int):
    """The chunk-recurrence kernel for a launch over ``pieces`` ((bos, eos, sequence) each; the V tile from
    their lengths, value_tile.py)."""
    chunks = chain_chunks(pieces, len(pieces), C)
    # not BV 128: chunk_fwd_v128 has no transition mode, and CP runs on few chains (narrow tiles)
    BV = value_tile(chunks, p.h_v, sms, {bv: us for bv, us in FORWARD_STEP_US.items() if bv != 128}, p.V)
    factory = kernels.recurrence((p.V // BV) * len(pieces) * p.h_v, sms, arch, bv=BV)
    return factory(p.h_qk, p.h_v, p.K, p.V, BV, C, dtype, state_v_first, arch.name)


def first_crossing(g_cumsum: torch.Tensor, last: torch.Tensor, valid: torch.Tensor, threshold: float):
    """`[P, H_v]` int64: for each piece j and head h, the first r at which the running sum of gam_C over
    the chunks ``last[j, 0..r]`` drops below ``threshold`` (Lr, the table's width, where it never does).

    Args:
        g_cumsum: `[n_tok, H_v]` in-chunk cumsum of g (on a chunk's last token: gam_C).
        last, valid: `[P, Lr]` int64 / bool: the last token of each piece's r-th chunk in the order
            the sum walks (cp.py's pass1_rev_* from the piece end, bwd_fwd_* from its start), and
            which entries are chunks of the piece (the others add 0).
    """
    gam = g_cumsum.t()[:, last].to(torch.float64)  # [H, P, Lr]
    gam = torch.where(valid, gam, torch.zeros((), dtype=gam.dtype, device=gam.device))
    crossed = gam.cumsum(-1) < threshold
    return (~crossed).to(torch.int64).cumprod(-1).sum(-1).t()


def warmup_skips(plan: CPPlan, g_cumsum: torch.Tensor, decay_threshold: float | None):
    """The chunk_skip tables of the local and transition passes (launch (b) of the module docstring),
    from device tensors only (no host sync).

    Args:
        g_cumsum: `[n_tok, H_v]` in-chunk cumsum of g (its value on a chunk's last token is the chunk's
            total log-decay gam_C; pieces are chunk-aligned, so chunks of pieces are chunks of the
            sequences).

    Returns:
        (skip_local, skip_m, fallback): `[P1, H_v]` int32, int32, bool over the pieces of
        ``plan.pass1``. skip_local = m_j - n(j, h) (0 for fallback heads, m_j for pieces that are
        last in their sequence); skip_m = 0 for fallback heads, else m_j (no work); fallback: the
        piece's S_loc and M enter the chain and the head never decays below e^threshold within it.
    """
    m = plan.pass1_n_chunks[:, None]  # [P1, 1]
    needed = plan.pass1_needed[:, None]
    if decay_threshold is None:
        reached = torch.zeros((), dtype=torch.bool, device=m.device)
        n_fwd = m
    else:
        # chunks counted back from the piece end: the last r + 1 chunks decay below e^threshold
        first = first_crossing(g_cumsum, plan.pass1_rev_last, plan.pass1_rev_valid, decay_threshold)
        reached = first < plan.pass1_rev_last.shape[-1]  # zero padding never crosses first: first < m_j here
        n_fwd = first + 1
    fallback = needed & ~reached
    zero = torch.zeros((), dtype=m.dtype, device=m.device)
    skip_local = torch.where(needed, torch.where(reached, m - n_fwd, zero), m)
    skip_m = torch.where(fallback, zero, m)
    H = g_cumsum.shape[1]
    P1 = m.shape[0]
    return tuple(x.expand(P1, H).to(dtype).contiguous()
                 for x, dtype in ((skip_local, torch.int32), (skip_m, torch.int32), (fallback, torch.bool)))


def warmup_tables(plan: CPPlan, g_cumsum: torch.Tensor, decay_threshold: float | None, arch_name: str = ""):
    """common/cp_tables.cp_tables in torch (the twins' form): (skip_local, skip_m, flag `[P1 + 1, H_v]`
    int32 with a zero last row)."""
    skip_local, skip_m, fallback = warmup_skips(plan, g_cumsum, decay_threshold)
    flag = torch.zeros(fallback.shape[0] + 1, fallback.shape[1], dtype=torch.int32, device=fallback.device)
    flag[:-1] = fallback.to(torch.int32)
    return skip_local, skip_m, flag


@dataclass(frozen=True)
class PieceTransitions:
    """The transitions the chain of launch (c) used, for backward_cp's chain (the adjoint needs M^T of
    the same pieces and heads; its truncation rule is the same: a (piece, head) enters with M exactly
    where the piece does not decay below e^threshold).

    M: `[P1 + 1, H_v, K, K]`, row r = piece ``first`` + r of the plan's pass1 range, as the recurrence
    stored it (M, or M^T with ``state_v_first``), or its (M_hi, M_lo) split (`ForwardKernels.split`);
    valid only where ``flag`` is 1. flag: `[P1 + 1, H_v]` int32 (the last row 0). The backward's chain
    reads both through the plan's bwd_slot_msrc32, M transposed unless ``state_v_first`` (cp_correct's
    msrc, transpose_m): no copy.
    """

    M: torch.Tensor | tuple
    flag: torch.Tensor
    first: int
    state_v_first: bool


def piece_initial_states(p, plan, state_v_first, q2, k2, v2, g_cumsum, Ag, Pm, user_h0, decay_threshold,
                         transition, kernels: ForwardKernels, arch, sms: int, o_scratch):
    """Launches (b) and (c) of the module docstring: the initial state of every piece of ``plan``.

    Args:
        q2, k2: `[n_tok, H_qk, K]`; v2, o_scratch: `[n_tok, H_v, V]` (o_scratch's rows are overwritten
            with garbage); g_cumsum `[n_tok, H_v]` (the in-chunk cumsum: the kernels' input and the
            source of the warm-up decision); Ag, Pm: kkt_solve's masks (bwd_prepare's Ag, Pg are the
            same tensors).
        user_h0: `[N, *state]` per-sequence initial states in the call's layout (zeros if none),
            float32 (float64 with the twins); its dtype is the dtype of the result.

    Returns:
        (h0_pieces `[P, *state]` (contiguous), `PieceTransitions` of the chain or None without pass1).
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
        kernel1 = _recurrence(kernels, plan.pieces[lo:hi], p, C, dtype, state_v_first, arch, sms)
        # pieces in token order: piece_order is the identity, its first P1 rows serve this range's launch
        rng = (plan.pass1_cu, plan.pass1_chunk_offsets, plan.piece_order)
        # (b) warm-up tables, then the local pass: S_loc of every (piece, head) from zero over its
        # warm-up window (the whole piece for fallback heads).
        skip_local, skip_m, flag = (kernels.tables or warmup_tables)(plan, g_cumsum, decay_threshold, arch.name)
        # + row P1, read by the chain's steps past a sequence's pieces: their outputs go to the scratch row P, which
        # nothing reads, so it is not zeroed
        S_loc = torch.empty((P1 + 1,) + state, dtype=sdt, device=dev)
        no_h0 = torch.empty((1,) + state, dtype=sdt, device=dev)  # has_h0 = 0: never read (as forward.py)
        kernel1(*views, *rng, skip_local, no_h0, o[:tok_hi], S_loc, h_dummy, p.scale, 0, 1, 0, 1)
        if decay_threshold is None:
            run_m = True
        else:
            capturing = dev.type == "cuda" and torch.cuda.is_current_stream_capturing()
            run_m = transition == "always" or capturing or bool(flag.any())
        # M of (piece, head) pairs that do not fall back is never read (flag 0): not zeroed. Without the
        # transition pass no pair falls back, so flag is all zero.
        M = torch.empty((P1 + 1, H, K, K), dtype=sdt, device=dev)
        if run_m:
            # Transition pass, fallback heads only: the recurrence's transition mode (has_h0 = 2: start
            # from the identity, V read as zero) gives M (its own layout-transposed form with
            # state_v_first). Blocks that skip every chunk store the identity.
            kernel1(*views, *rng, skip_m, no_h0, o[:tok_hi], M, h_dummy, p.scale, 2, 1, 0, 1)
        # (c) correction over piece positions, all long sequences at once: one chain launch. Its
        # states are [K, V]; with state_v_first the stored S^T and M^T are transposed around it.
        # the chain writes each long sequence's piece states straight into their rows of the result (plan.slot_rows32;
        # row P takes the chain slots past a sequence's pieces); every sequence's first piece starts from its h0
        P = plan.n_pieces
        src = plan.slot_src
        # the chain's products read M as it is stored: transposed with state_v_first (M^T stored)
        Mk = kernels.split(M, arch.name) if kernels.split is not None else M
        del M
        if state_v_first:
            kv_rows = torch.empty((P + 1, H, K, state[1]), dtype=sdt, device=dev)
            kernels.correct(user_h0.transpose(-1, -2).contiguous(), S_loc.transpose(-1, -2).contiguous(),
                            Mk, flag, src, kv_rows, arch.name, transpose_m=True, out_rows=plan.slot_rows32,
                            init_rows=plan.slot_seq)
            rows = kv_rows.transpose(-1, -2).contiguous()
        else:
            rows = torch.empty((P + 1,) + tuple(user_h0.shape[1:]), dtype=sdt, device=dev)
            kernels.correct(user_h0, S_loc, Mk, flag, src, rows, arch.name, out_rows=plan.slot_rows32,
                            init_rows=plan.slot_seq)
        if len(plan.long_seqs) < plan.n_seqs:  # one-piece sequences (the long ones' first rows hold the chain's output 0)
            rows.index_copy_(0, plan.first_piece, user_h0)
        transitions = PieceTransitions(Mk, flag, lo, state_v_first)
        return rows[:P], transitions
    return user_h0[plan.piece_seq].contiguous(), None  # no chain: every piece is its sequence
