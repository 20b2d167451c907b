"""Backward with intra-card context parallelism (CP), built only from the existing kernels.

The public API's backward (`ChunkGatedDeltaRuleFunction`) runs it whenever its forward ran CP
(KernelOptions.cp / QLABENCH_CP), over the forward's pieces. tests/kernels/test_backward_cp_gpu.py
checks it on the GPU against the plain device backward and the float64 reference; the CPU tests
(tests/kernels/test_backward_cp.py) run this exact orchestration with the float64 twins of the
kernels (`emulate_bwd.KERNEL_TWINS`, `emulate_fwd.TWIN_KERNELS`).

Why. The backward's serial parts are the two chunk recurrences: bwd_h (forward over chunks, the
state at every chunk start) and bwd_dh (reverse over chunks, the state gradient at every chunk end,
dv, dh0). With one long sequence and few heads their grid is a handful of blocks that walk hundreds
of chunks while most SMs idle; bwd_prepare and the per-chunk gradients (backward.chunk_grads) are per chunk and already
parallel. The plan (`cp.py`, the forward's) cuts long sequences into chunk-aligned pieces; pieces
share the sequences' chunk grid, so every per-chunk table (bwd_prepare's masks and factors, the
chunk bounds, the h / dh rows) is the same for pieces as for sequences, and a piece is run by the
recurrence kernels as a "sequence" of the plan's cu_pieces / chunk_offsets tables.

Algebra (per v-head, states in the kernels' [K, V] layout; flashqla-design.md 1.4, 1.6, 4.5). A
piece maps its initial state S_in to its final state as S_out = M S_in + S_loc with
M = prod_c M_c, M_c = exp(gam_C) (I - K^T A_k diag(beta) K) (forward_cp.py). The reverse pass is
the adjoint of this affine map: with dS_end the gradient of the loss w.r.t. the state at the piece
end,

    dS_start = M^T dS_end + dS_loc,

dS_loc = the start gradient of the reverse pass from terminal gradient 0 (it collects dO of the
piece's tokens). For the pieces 0 .. m of one sequence, dS_end(m) = dht (or 0) and
dS_end(j) = dS_start(j + 1). So

    dS_start(m)  = dS_loc'(m)                            (the local pass runs the last piece from dht)
    dS_end(j)    = dS_start(j + 1)
    dS_start(j)  = dS_loc(j) + M(j)^T dS_end(j),         j = m - 1 .. 1,

and dh0 = dS_start(0), which the final reverse pass over piece 0 produces.

Launches:
  (a) bwd_prepare over the original chunks (as backward.py): Pg, Ag, factors e, r, beta.
  (b) piece initial states S_in: taken from the CP forward (``h0_pieces``, returned by
      `forward_cp.chunk_gated_delta_rule_fwd_cp(..., return_piece_states=True)`), or recomputed with
      forward_cp's own launches (`forward_cp.piece_initial_states`: warm-up tables, local pass over
      each head's warm-up window, transition pass for fallback heads, batched correction;
      bwd_prepare's Ag / Pg are kkt_solve's Ag / Pm) when not given: 0 or 1-2 recurrence launches
      plus the forward's chain, with the forward's warm-up truncation (and its bound).
  (c) bwd_h over all pieces from S_in (all pieces in parallel): h at every chunk start. bwd_h and
      bwd_dh use one V tile, `backward._value_tile` of the P * H_v (piece, v-head) pairs. bwd_h runs on
      the caller's stream beside (d) and (e), which read nothing it writes and run on a second stream
      (`streams.Beside`), joined before (f).
  (d) local reverse pass: bwd_dh over the piece range ``plan.bwd_pass`` (every piece that is not
      first in its sequence; first pieces in between skip all their chunks) from terminal gradient 0,
      or its sequence's dht for a last piece -> dS_loc (bwd_dh's dh0 output); those terminal gradients
      are rows of one buffer, written by one launch of common/cp_rows.py (over plan.dht_src32). A middle piece runs
      only its first n(j, h) chunks (`local_skips`, the kernel's chunk_skip: n = the first count from
      the piece start at which the summed gam_C drops below ``decay_threshold``; all of them when it
      never does; on the device one launch of common/cp_tables.py over the plan's bwd_*32 tables). The
      pass stores only dS_loc (sm90's bwd_dh_ws skips its dh, dV', dv rows under has_skip). Transition pass (only without the forward's `PieceTransitions`): the same launch
      with dO = 0 and terminal gradient I (K == V) -> M^T (the identity trick of forward_cp.py, on
      the adjoint: with dO = 0 the reverse step is linear, dS_prev = M_c^T dS, so from dS = I it ends
      at M^T), run only by the (piece, head) pairs whose M^T the chain reads.
      Chain over piece positions counted from the end, all long sequences at once: one launch of
      common/cp_correct.py (M^T read only where a piece enters the chain untruncated). With the forward's
      transitions the chain reads them in place: their bf16 split (`ForwardKernels.split`) through
      plan.bwd_slot_msrc32, transposed (cp_correct's msrc, transpose_m), so no M^T copy and no split here.
  (e) final reverse pass: bwd_dh over all pieces from the corrected terminal gradients: dh at every
      chunk end, dV', dv, and dh0 of each sequence = the start gradient of its first piece.
  (f) the per-chunk gradients (backward.chunk_grads: bwd_chunk on sm90) over the original chunks,
      unchanged; GQA sums and the padding tail as
      backward.py. The reverse cumsum of dg is chunk-local, so pieces change nothing there.
  TileLang launches on sm90 with S_in given and no transition pass: 8 (bwd_prepare, cp_tables, cp_dht_rows,
  bwd_dh local, cp_correct, bwd_h, bwd_dh final, bwd_chunk); 7 with bwd_fused (in place of the final bwd_dh
  and bwd_chunk); one more with the transition pass (backward.py: 4), plus 2-3 for the S_in recompute.

Error bound of the truncation (``decay_threshold``, default -10, same rule as forward_cp.py). For
each piece j of the local reverse range and head h, d(j, h) = sum of g over the piece's tokens (here
the sum of its chunks' final gam, read from g_cumsum). If d < threshold the head's M(j)^T is dropped
(treated as 0) in the chain; else the exact M(j)^T is used. With ||k_t||_2 = 1 and 0 <= beta_t <= 2,
||M(j)^T||_2 = ||M(j)||_2 <= exp(d(j, h)) < e^threshold (forward_cp.py's argument; the spectral
norm is transpose-invariant). A dropped (decaying) head's local pass also stops after the first
n(j, h) chunks: it leaves out D(j) = (M_0 ... M_{n-1})^T G(j), G(j) the exact piece-local gradient
(terminal 0) at the end of chunk n - 1, with ||D(j)||_2 <= e^threshold ||G(j)||_2 by the same
argument over the window. The error e(j) of dS_end(j) obeys e(m) = 0 (the last piece is exact) and
e(j - 1) = M(j)^T dS_end(j) - D(j) (dropped) or M(j)^T e(j) (kept: such a head never crosses the
threshold, so its local pass is whole), so for every piece j

    ||e(j)||_2 <= e^threshold * max_{i > j} (||dS_end(i)||_2 + ||G(i)||_2)     (e^-10 ~ 4.5e-5)

with dS_end(i) the exact piece-end gradients (a subset of the exact chunk-end gradients dh). The
final reverse pass is linear in its terminal gradient and each of its steps is non-expansive on the
state-gradient path, so dh inside piece j and dh0 (= through piece 0) are off by at most ||e(j)||_2;
the other gradients of piece j (dq, dk, dv, dbeta, dg) are off by the exact gradient of the loss
<e(j), S_end(j)>, i.e. linear in e(j). Last pieces are never truncated (their terminal gradient is
the user's dht). The piece initial states carry the forward's truncation error (forward_cp.py's
bound) when they come from a truncated CP forward. ``decay_threshold=None`` keeps every M^T (exact
up to rounding). ``transition`` as forward_cp.py: "auto" skips the transition pass when no piece
that enters the chain falls back (one host read of a flag; never during a CUDA-graph capture),
"always" never syncs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .common.chunks import chunk_table, f32_buffers
from .common.cp_correct import cp_correct
from .common.cp_rows import dht_rows, dht_rows_torch
from .common.cp_tables import cp_tables
from .cp import CPPlan, plan_cp
from .forward_cp import (
    ForwardKernels,
    PieceTransitions,
    check_cp_arguments,
    first_crossing,
    piece_initial_states,
)
from .streams import Beside

__all__ = ["BackwardCPKernels", "chunk_gated_delta_rule_bwd_cp"]


@dataclass(frozen=True)
class BackwardCPKernels:
    """The kernels the CP backward launches.

    bwd: {name: kernel} of backward.py's five kernels (or `emulate_bwd.KERNEL_TWINS`);
    correct: the correction chain (common/cp_correct.cp_correct, or emulate_fwd.twin_cp_correct);
    fwd: forward_cp's `ForwardKernels` (``recurrence`` and ``correct``: the S_in recompute), or None
    when the piece initial states are always passed in;
    tables: common/cp_tables.cp_tables (its ``direction="backward"`` form gives the local pass's chunk_skip
    in one launch), or None: `local_skips`, its torch form, which the twins use;
    rows: common/cp_rows.dht_rows (the pieces' terminal-gradient rows in one launch), or None: its torch form
    (`cp_rows.dht_rows_torch`, a fill and an index copy), which the twins use.
    """

    bwd: dict
    correct: Callable
    fwd: ForwardKernels | None = None
    tables: Callable | None = None
    rows: Callable | None = None


def chunk_gated_delta_rule_bwd_cp(
    q, k, v, g_cumsum, beta, A, do, dht=None, scale=None, initial_state=None, cu_seqlens=None,
    state_v_first=False, plan: CPPlan | None = None, decay_threshold: float | None = -10.0, *,
    h0_pieces: torch.Tensor | None = None, transitions: PieceTransitions | None = None,
    plan_heads: int | None = None, transition: str = "auto", options=None, masks=None,
):
    """`backward.chunk_gated_delta_rule_bwd` with intra-card CP (see the module docstring).

    Args: as chunk_gated_delta_rule_bwd, plus
        plan: the CP forward's plan for these cu_seqlens (None: planned here exactly as
            forward_cp plans, with ``plan_heads`` or H_v).
        decay_threshold: negative float (drop M^T where a piece decays below e^threshold) or None.
        h0_pieces: the initial state of every piece of ``plan`` from the CP forward
            (`[P, H_v, K, V]`, `[P, H_v, V, K]` with ``state_v_first``), or None: recomputed here.
        transitions: the CP forward's `forward_cp.PieceTransitions` (its seventh entry with
            return_piece_states), or None: the transition pass runs here. Given, their M^T and
            truncation decisions (the forward's, made by the same rule) replace the pass. With
            h0_pieces None the recompute's own transitions serve the same way.
        plan_heads, transition: as forward_cp.chunk_gated_delta_rule_fwd_cp.
        options: `options.KernelOptions` (``bwd_dh`` picks the reverse pass, ``fwd_kernel`` the
            recurrence of the S_in recompute); None: the QLABENCH_BWD_DH / QLABENCH_FWD_KERNEL switches.
        masks: the forward's kkt_solve masks (`forward.KktMasks`) or None, as chunk_gated_delta_rule_bwd's.

    Returns:
        (dq, dk, dv, dbeta, dg, dh0) exactly as chunk_gated_delta_rule_bwd.
    """
    from . import backward
    from .dispatch import arch_for_device, require_backward
    from .forward import _sm_count
    from .forward_cp import _device_kernels

    arch = arch_for_device(q.device)
    require_backward(arch)
    p = backward._check_inputs(q, k, v, g_cumsum, beta, A, do, dht, scale, initial_state, cu_seqlens,
                               state_v_first, arch.chunk_size)
    sms = _sm_count(q.device)
    if plan is None:
        plan = plan_cp(cu_seqlens, heads=plan_heads or p.h_v, sm_count=sms, chunk_size=arch.chunk_size,
                       B=p.B, T=p.T, device=q.device)
    # one V tile for bwd_h / bwd_dh from the grid of the pieces' final pass (P * H_v blocks per tile)
    from .value_tile import chain_chunks

    chunks = chain_chunks(plan.pieces, plan.n_pieces, arch.chunk_size)
    bv = backward._value_tile(chunks, p.h_v, sms, arch.name)
    bwd_dh, fwd_kernel = (None, None) if options is None else (options.bwd_dh, options.fwd_kernel)
    bwd_dh = backward.cp_dh_choice(arch, p.h_qk, p.h_v, plan, bwd_dh)
    masks = backward.check_masks(masks, p, q.dtype, q.device, arch.chunk_size)
    prepare, masks = backward._prepare_masks(arch.name, masks)
    kernels = BackwardCPKernels(backward._kernels(p.h_qk, p.h_v, backward._DTYPE_NAMES[q.dtype], arch.name, bv,
                                                  bwd_dh, prepare), cp_correct,
                                _device_kernels(arch, fwd_kernel) if h0_pieces is None else None, cp_tables, dht_rows)
    return _bwd_cp(p, q, k, v, g_cumsum, beta, A, do, dht, initial_state, cu_seqlens, state_v_first, plan,
                   decay_threshold, transition, h0_pieces, kernels, arch, sms, transitions, masks)


def check_transitions(transitions: PieceTransitions, plan: CPPlan) -> None:
    """The forward's transitions are those of ``plan``'s forward chain (the rows plan.bwd_slot_msrc32 reads)."""
    M = transitions.M[0] if isinstance(transitions.M, tuple) else transitions.M
    if plan.pass1 is None or plan.bwd_slot_msrc32 is None:
        raise ValueError("transitions given for a plan without a forward chain (plan.pass1 is None)")
    lo, hi = plan.pass1
    if transitions.first != lo or M.shape[0] != hi - lo + 1 or transitions.flag.shape[0] != hi - lo + 1:
        raise ValueError(f"transitions cover {M.shape[0] - 1} pieces from {transitions.first}, the plan's forward "
                         f"chain {hi - lo} from {lo}")


def _chunk_gate_prefix(g2: torch.Tensor, bounds: torch.Tensor):
    """tok_hi -> `[tok_hi + 1, H]` float64 prefix sums over tokens of each chunk's final gam (placed on
    the chunk's last token): for chunk-aligned pieces prefix[end] - prefix[start] = the sum of g
    over the piece. No host sync."""
    n_tok, H = g2.shape
    ends = (bounds[:, 1].long() - 1).clamp(min=0)
    valid = (bounds[:, 1] > bounds[:, 0])[:, None]
    last = torch.where(valid, g2[ends].to(torch.float64), torch.zeros((), dtype=torch.float64, device=g2.device))
    x = torch.zeros(n_tok, H, dtype=torch.float64, device=g2.device)
    x.index_add_(0, ends, last)
    prefix = torch.zeros(n_tok + 1, H, dtype=torch.float64, device=g2.device)
    prefix[1:] = x.t().contiguous().cumsum(1).t()  # scan along the contiguous dim (dim-0 scans are slow)
    return lambda tok_hi: prefix[: tok_hi + 1]


def local_skips(plan: CPPlan, g_cumsum: torch.Tensor, decay_threshold: float | None) -> torch.Tensor:
    """chunk_skip `[P2, H_v]` int32 of the local reverse pass over ``plan.bwd_pass`` (device ops, no
    host sync): a first piece skips all its chunks (its result is unused); a last piece none (it
    carries its sequence's dht); a middle piece keeps its first n chunks, n the first count at which
    the summed gam_C from the piece start drops below ``decay_threshold`` (the rest reach the piece
    start through a decay below e^threshold), or all of them when it never does (the head falls back,
    as the chain's M^T).

    Args:
        g_cumsum: `[n_tok, H_v]` in-chunk cumsum of g (its value on a chunk's last token is gam_C).
    """
    m = plan.bwd_fwd_valid.sum(-1)[:, None]  # [P2, 1] chunks per piece
    skip_all = plan.bwd_skip_all[:, None]
    if decay_threshold is None:
        skip = skip_all.expand(-1, g_cumsum.shape[1])
    else:
        # chunks counted from the piece start
        first = first_crossing(g_cumsum, plan.bwd_fwd_last, plan.bwd_fwd_valid, decay_threshold)  # [P2, H]
        keep = torch.minimum(first + 1, m)
        trunc = (plan.bwd_trunc[:, None] == 1) & (first < m)
        skip = torch.where(trunc, m - keep, torch.zeros_like(keep)) + skip_all
    return skip.to(torch.int32).contiguous()


def _bwd_cp(p, q, k, v, g_cumsum, beta, A, do, dht, initial_state, cu_seqlens, state_v_first, plan,
            decay_threshold, transition, h0_pieces, kernels: BackwardCPKernels, arch, sms: int,
            transitions: PieceTransitions | None = None, masks=None):
    """The orchestration; ``kernels`` are the device kernels or their float64 twins; ``masks`` the forward's
    `forward.KktMasks` when kernels' bwd_prepare forms only the missing ones, else None."""
    from .backward import chunk_grads, dv_in_chunk, fused_grads, gradients_out, mask_buffers

    C = arch.chunk_size
    check_cp_arguments(p, plan, decay_threshold, transition, C)
    dev, dtype = q.device, q.dtype
    BT, H, K, V = p.B * p.T, p.h_v, p.K, p.V
    f32 = f32_buffers(dtype)
    P = plan.n_pieces
    state_shape = (H, V, K) if state_v_first else (H, K, V)
    if h0_pieces is not None:
        if tuple(h0_pieces.shape) != (P,) + state_shape:
            raise ValueError(f"h0_pieces must have shape {(P,) + state_shape} (one state per piece of the "
                             f"plan), got {tuple(h0_pieces.shape)}")
    elif plan.pass1 is not None and kernels.fwd is None:
        raise ValueError("h0_pieces is None and no forward kernels were given to recompute them")
    bwd = kernels.bwd
    q2 = q.reshape(BT, p.h_qk, K).contiguous()
    k2 = k.reshape(BT, p.h_qk, K).contiguous()
    v2 = v.reshape(BT, H, V).contiguous()
    do2 = do.reshape(BT, H, V).contiguous()
    g2 = g_cumsum.reshape(BT, H).contiguous()
    b2 = beta.reshape(BT, H).to(f32).contiguous()
    A2 = A.reshape(BT, H, C).contiguous()
    table = chunk_table(cu_seqlens, p.seq_bounds, p.B, p.T, C, dev)
    bounds, ncmax = table.chunk_bounds, table.n_chunks_max

    def kv(x, n):  # per-sequence (or per-piece) states in the kernels' [K, V] layout
        if x is None:
            return torch.zeros(n, H, K, V, dtype=f32, device=dev)
        return (x.transpose(-1, -2) if state_v_first else x).to(f32).contiguous()

    user_h0, user_dht = kv(initial_state, p.N), kv(dht, p.N)

    fused = "bwd_fused" in bwd  # bwd_dh=fused: no dh buffer, no final reverse pass (bwd_fused carries dS)
    h = torch.empty(ncmax, H, K, V, dtype=dtype, device=dev)
    dh = torch.empty(1 if fused else ncmax, H, K, V, dtype=dtype, device=dev)  # fused: the local passes' scratch
    dv = torch.empty(BT, H, V, dtype=dtype, device=dev)
    dvp = dv if dv_in_chunk(bwd) else torch.empty(BT, H, V, dtype=dtype, device=dev)  # as backward.py
    Pg, Ag = mask_buffers(masks, BT, H, C, dtype, dev)
    fac = torch.empty(ncmax, H, 3, C, dtype=f32, device=dev)
    # (a) masks and factors of every chunk.
    bwd["bwd_prepare"](q2, k2, g2, b2, A2, bounds, Pg, Ag, fac, p.scale)

    # (b) the initial state of every piece.
    if h0_pieces is not None:
        S_in = kv(h0_pieces, P)
    else:
        # forward_cp's launches in the [K, V] layout (state_v_first=False kernels); dvp is scratch
        # for the discarded outputs (the final reverse pass overwrites it).
        S_in, transitions = piece_initial_states(p, plan, False, q2, k2, v2, g2, Ag, Pg, user_h0,
                                                 decay_threshold, transition, kernels.fwd, arch, sms, dvp)
    # (c) states at every chunk start, all pieces in parallel, on the caller's stream beside (d) and (e), which
    # run on a second stream (streams.Beside: they read nothing bwd_h writes; joined before (f)).
    dh0_pieces = None if fused else torch.empty(P, H, K, V, dtype=f32, device=dev)  # fused: bwd_fused's own
    with Beside(dev) as beside:
        with beside.side():
            dht_pieces = _reverse_passes(p, q2, k2, do2, Pg, Ag, fac, g2, bounds, plan, decay_threshold, transition,
                                         transitions, kernels, arch, user_dht, dh, dvp, dv, dh0_pieces)
        bwd["bwd_h"](k2, v2, A2, fac, plan.cu_pieces, plan.chunk_offsets, plan.piece_order, S_in, h)
    del Pg, Ag, fac

    # (f) per-chunk gradients over the original chunks (as backward.py); fused: per piece from its end gradient
    if fused:
        chains = plan.fused_chains
        dq_v, dk_v, dv, dbeta, dg, dh0_pieces = fused_grads(bwd, p, q2, k2, v2, do2, g2, b2, A2, h, dht_pieces, chains,
                                                            dv)
    else:
        del dht_pieces  # read by (e) only
        dq_v, dk_v, dbeta, dg = chunk_grads(bwd, p, q2, k2, v2, do2, dvp, dv, g2, b2, A2, h, dh, bounds, C)
    del h, dh, dvp
    dh0 = None if initial_state is None else plan.first_rows(dh0_pieces)
    return gradients_out(p, table, cu_seqlens, dq_v, dk_v, dv, dbeta, dg, dh0, beta, initial_state, state_v_first)


def _reverse_passes(p, q2, k2, do2, Pg, Ag, fac, g2, bounds, plan, decay_threshold, transition, transitions,
                    kernels: BackwardCPKernels, arch, user_dht, dh, dvp, dv, dh0_pieces) -> torch.Tensor:
    """(d) and (e): the terminal gradient of every piece (returned), then the final reverse pass over all pieces into
    dh, dvp (and dv where bwd_dh stores it: backward.dh_pass_rows) and dh0_pieces (not with bwd_fused, which runs
    the pieces' chains itself)."""
    from .backward import dh_pass_rows

    dev = q2.device
    H, K, V = p.h_v, p.K, p.V
    f32 = f32_buffers(q2.dtype)
    bwd = kernels.bwd
    # (d) local reverse pass, transition pass and chain -> the terminal gradient of every piece.
    if plan.bwd_pass is not None:
        lo, hi = plan.bwd_pass
        P2 = hi - lo
        tok_lo, tok_hi = plan.pieces[lo][0], plan.pieces[hi - 1][1]
        views = [x[:tok_hi] for x in (q2, k2, do2, Pg, Ag)]
        # sm90's bwd_dh_ws leaves them (has_skip); the final pass (e) writes them
        scratch = dh_pass_rows(bwd, dh, dvp[:tok_hi], dv[:tok_hi])
        rng = (plan.bwd_pass_cu, plan.bwd_pass_chunk_offsets, plan.bwd_pass_order)
        # The pieces' terminal gradients, one row per piece (+ row P, the chain's scratch): every sequence's dht in its
        # last piece's row, zero elsewhere until the chain (below) writes the others. Rows lo .. hi - 1 are
        # therefore the local pass's terminal gradients as they are: zero, but dht for a sequence's last piece.
        P = plan.n_pieces
        rows = torch.empty(P + 1, H, K, V, dtype=f32, device=dev)
        (kernels.rows or dht_rows_torch)(user_dht, plan.dht_src32, rows, arch.name)  # rows[:P]; row P is scratch
        dht_loc = rows[lo:hi]
        # + row P2, read by the chain's steps past a sequence's pieces: their outputs go to the scratch row P, which
        # nothing reads, so it is not zeroed
        dS_loc = torch.empty(P2 + 1, H, K, V, dtype=f32, device=dev)
        if kernels.tables is not None:
            skip_loc = kernels.tables(plan, g2, decay_threshold, arch.name, "backward")[0]
        else:
            skip_loc = local_skips(plan, g2, decay_threshold)
        bwd["bwd_dh"](*views, fac, *rng, skip_loc, dht_loc, *scratch, dS_loc[:P2], p.scale, 1)
        msrc, transpose_m = None, False
        if transitions is not None:  # the forward chain's M (read transposed) and truncation decisions
            check_transitions(transitions, plan)
            Mt, flag, msrc, transpose_m = (transitions.M, transitions.flag, plan.bwd_slot_msrc32,
                                             not transitions.state_v_first)
        else:
            # Truncation: fallback[j, h] = the piece enters the chain and does not decay below e^threshold.
            needs = plan.bwd_needs_m[:, None]
            if decay_threshold is None:
                fallback = None
                run_m = True
            else:
                csum = _chunk_gate_prefix(g2, bounds)(tok_hi)
                decay = csum[plan.bwd_piece_end] - csum[plan.bwd_piece_start]  # [P2, H]
                fallback = (decay > decay_threshold) & needs
                capturing = dev.type == "cuda" and torch.cuda.is_current_stream_capturing()
                run_m = transition == "always" or capturing or bool(fallback.any())
            # M^T of (piece, head) pairs that do not enter the chain is never read (flag 0): not zeroed.
            Mt = torch.empty(P2 + 1, H, K, K, dtype=f32, device=dev)
            flag = torch.zeros(P2 + 1, H, dtype=torch.int32, device=dev)  # + the zero row of the slots
            if run_m:
                do_zero = torch.empty_like(do2[:tok_hi])
                do_zero[tok_lo:].zero_()
                eye = torch.eye(K, dtype=f32, device=dev).expand(P2, H, K, K).contiguous()
                views[2] = do_zero
                # fallback (piece, head) pairs only: the others skip every chunk (their M^T is never read)
                read = needs.expand(P2, H) if fallback is None else fallback
                m = plan.bwd_fwd_valid.sum(-1)[:, None].expand(P2, H)
                skip_m = torch.where(read, torch.zeros_like(m), m)
                bwd["bwd_dh"](*views, fac, *rng, skip_m.to(torch.int32).contiguous(), eye, *scratch, Mt[:P2],
                              p.scale, 1)
                flag[:P2] = read.to(torch.int32)
        # Chain from the last piece backwards (one launch, starting from dS_loc's rows of the long sequences' last
        # pieces): slot s of long sequence l = dS_start(last_l - s), written into the row of piece last_l - 1 - s
        # (plan.bwd_slot_rows32; row P takes the slots past a sequence's pieces); no gathered copy
        kernels.correct(dS_loc, dS_loc, Mt, flag, plan.bwd_slot_src32, rows, arch.name, msrc=msrc,
                        transpose_m=transpose_m, out_rows=plan.bwd_slot_rows32, init_rows=plan.bwd_slot_first)
        del dS_loc  # the fp32 local gradients were at the training step's peak
        dht_pieces = rows[:P]
    else:
        dht_pieces = user_dht[plan.piece_seq].contiguous()  # no chain: every piece is its sequence
    if "bwd_fused" in bwd:
        return dht_pieces

    # (e) final reverse pass over all pieces.
    no_skip = torch.empty(1, H, dtype=torch.int32, device=dev)  # has_skip = 0: never read
    bwd["bwd_dh"](q2, k2, do2, Pg, Ag, fac, plan.cu_pieces, plan.chunk_offsets, plan.piece_order, no_skip,
                  dht_pieces, *dh_pass_rows(bwd, dh, dvp, dv), dh0_pieces, p.scale, 0)
    return dht_pieces
