"""Intra-card context parallelism (CP): the plan that cuts long sequences into pieces.

Why. The chunk recurrence is serial per (sequence, head): on the H200 one chunk step of the
pipelined recurrence takes ~1.9 us with one block per SM (results/h200/NOTES.md), so a 32k-token
sequence costs 512 steps however few heads it has, while most of the 132 SMs idle. The recurrence
is affine in the state (S_out = M S_in + S_loc per piece, see `forward_cp.py`), so a sequence can be
cut into pieces that run in parallel from corrected initial states.

Model (FlashQLA's stated latency model, flashqla-design.md 4.2). With Lc chunks in all, H heads, P
SMs and pieces of L chunks, a CP forward takes about

    time ~ a L + b (H Lc / P) / L

(a L: the serial chain of one piece, paid by the local pass and the output pass; the second term:
the (H Lc / L) piece-head chains share P SMs, and the per-piece correction work grows with the piece
count). The optimum is L* ~ sqrt(H Lc / P) up to the unknown ratio b / a; here

    L = 2 ** round(log2(alpha * sqrt(H * Lc / P))),   L >= min_piece_chunks (4),

with alpha = 3 (FlashQLA's empirical factor; not yet fitted for our kernels: the next H200 session
fits it). Powers of two keep the number of distinct plans (and so of grid shapes) small; L >= 4
keeps the pipelined recurrence's 2-stage ring fed.

Enable rule. Without CP the grid holds ~Be * H long chains, Be = Lc / max_chunks (effective batch).
CP pays one extra pass plus a correction, so it only helps when those chains leave most SMs idle:

    on  iff  the longest sequence has more than L chunks (something to cut) and
             (Be H <= P * 40 / 132  or  (Be H <= P * 56 / 132 and max_chunks >= 128))

(FlashQLA's SM90 thresholds 40 / 56 at 132 SMs, scaled with the SM count). The API's default
(cp=auto) takes a plan only where our kernels were measured to gain from it, a stricter rule on top of
this one (`api.cp_rule`: a table of (most effective chains, fewest tokens of the longest sequence),
one for inference forwards and a wider one for forwards whose backward follows).

Tensor-parallel sharding. Upstream plans with the local head count, so a 16-head model run on 4 TP
ranks (4 heads each) cut its sequences differently from the unsharded run and the results differed
(flashqla-design.md 4.2, PR #31/#32). Here the caller may pass ``heads`` = the GLOBAL head count:
the split then depends only on (cu_seqlens, global heads, SM count, chunk size), identical on every
rank; the truncation decision is per (piece, head) and reads only that head's gates, so it does not
depend on the sharding either.

CUDA graphs. Planning reads cu_seqlens on the host (one sync, through `validate._host_values`, which
remembers values by tensor identity); the plan (host numbers + device index tensors) is cached by the
host values and the planning parameters. Inside a CUDA-graph capture nothing is read or uploaded: a
plan must have been made for the same cu_seqlens tensor before the capture, else RuntimeError.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from .validate import _host_values

__all__ = ["CPPlan", "build_plan", "choose_piece_chunks", "effective_chains", "plan_cp"]

ALPHA = 3.0
MIN_PIECE_CHUNKS = 4
# FlashQLA's SM90 enable thresholds (Be * Hv <= 40, or <= 56 with >= 128 chunks) at 132 SMs.
_ON_FRACTION = 40 / 132
_ON_FRACTION_LONG = 56 / 132
_LONG_CHUNKS = 128


def effective_chains(lengths, heads: int, chunk_size: int) -> float:
    """Be * H: the (sequence, head) chains of sequences of ``lengths`` tokens counted in units of the
    longest one (Be = total chunks / the longest sequence's chunks); 0 when there are no chunks."""
    chunks = [-(-int(n) // chunk_size) for n in lengths]
    longest = max(chunks, default=0)
    return heads * sum(chunks) / longest if longest else 0.0


def choose_piece_chunks(lengths, heads: int, sm_count: int, chunk_size: int, *, alpha: float = ALPHA,
                        min_piece_chunks: int = MIN_PIECE_CHUNKS) -> tuple[bool, int]:
    """(enabled, L): whether CP turns on for sequences of ``lengths`` tokens, and the piece length
    L in chunks (a power of two >= ``min_piece_chunks``; returned also when CP is off).

    Depends only on the lengths, ``heads`` (pass the global head count for a TP-sharded model),
    the SM count and the chunk size. See the module docstring for the rule and why.
    """
    if heads < 1 or sm_count < 1 or chunk_size < 1:
        raise ValueError(f"heads, sm_count and chunk_size must be positive, got {heads}, {sm_count}, "
                         f"{chunk_size}")
    chunks = [-(-int(n) // chunk_size) for n in lengths]
    total = sum(chunks)
    longest = max(chunks, default=0)
    if total == 0:
        return False, min_piece_chunks
    ideal = alpha * math.sqrt(heads * total / sm_count)
    L = max(min_piece_chunks, 2 ** round(math.log2(max(ideal, 1.0))))
    busy = effective_chains(lengths, heads, chunk_size)
    on = longest > L and (busy <= sm_count * _ON_FRACTION
                          or (busy <= sm_count * _ON_FRACTION_LONG and longest >= _LONG_CHUNKS))
    return on, L


@dataclass(frozen=True, eq=False)
class CPPlan:
    """Pieces of a packed batch and the device tables the CP forward reads.

    Every sequence with more than L chunks is cut at multiples of L * C tokens from its start (the
    last piece shorter); other sequences (also empty ones) are one piece each. Pieces are numbered in
    token order, so ``cu_pieces`` is a cu_seqlens of the pieces that the recurrence kernel takes as is.

    Host attributes: ``enabled`` (some sequence is cut, so the local pass and the correction run;
    a forced-on plan whose sequences are all short is not enabled), ``piece_chunks`` (L; 0 when off), ``chunk_size``, ``n_seqs``,
    ``pieces`` ((bos, eos, sequence) per piece), ``pass1`` ((p_lo, p_hi) piece range of the local
    pass, covering every piece that is not last in its sequence, or None), ``n_slots`` (most pieces
    of one sequence), ``long_seqs`` (the sequences of more than one piece), ``first_span`` ((lo, hi) when the
    sequences' first pieces are the consecutive rows lo..hi - 1: one sequence, or one piece each; else None).

    Device tensors (on ``device``):
        cu_pieces `[P + 1]` int32, chunk_offsets `[P + 1]` int32 (chunks before each piece),
        piece_seq `[P]` int64, is_first / is_last `[P]` bool, last_piece `[N]` int64, dht_src32 `[P]` int32 (the
        piece's sequence where it is the sequence's last piece, else -1: common/cp_rows.dht_rows' table),
        pass1_cu / pass1_chunk_offsets `[p_hi - p_lo + 1]` int32 (the local pass's table),
        piece_start / piece_end `[p_hi - p_lo]` int64 (token ranges of the local pass's pieces),
        pass1_n_chunks `[p_hi - p_lo]` int64 (chunks of each local-pass piece),
        pass1_needed `[p_hi - p_lo]` bool (the piece is not last in its sequence, so its S_loc and M
            enter the chain; the others run in the range for nothing),
        pass1_rev_last / pass1_rev_valid `[p_hi - p_lo, Lr]` int64 / bool, Lr = most chunks of a
            local-pass piece: entry (j, r) is the last token of chunk (n_chunks_j - 1 - r) of piece j
            (chunks counted back from the piece end; g_cumsum there is that chunk's total
            log-decay), valid for r < n_chunks_j (else 0 and False). forward_cp's warm-up
            truncation reads them.
        pass1_rev_last32 `[p_hi - p_lo, Lr]` int32 (pass1_rev_last with -1 where not valid) and
            pass1_piece32 `[p_hi - p_lo, 2]` int32 (n_chunks, needed): the same, as common/cp_tables.py
            reads them.
        slot_src `[n_slots - 1, n_long]` int32 (what cp_correct reads): for chain step s and long
            sequence l, the local-pass row of that sequence's piece s, or p_hi - p_lo (an extra row of any
            value: such a step's output goes to the scratch row P) past its second-to-last piece,
        slot_seq `[n_long]` int32: sequence of long sequence l (cp_correct's init_rows in the forward).
    Without a chain (pass1 / bwd_pass None: every sequence is one piece) a piece's initial state and terminal gradient
    are its sequence's: rows piece_seq of the user's h0 / dht.

    Backward tables (read by `backward_cp.py`; the mirror image of the forward's, for the reverse
    state-gradient chain; None / 0 where CP has nothing to chain):
        ``bwd_pass`` ((p_lo, p_hi) piece range of the local reverse pass, covering every piece that
        is not first in its sequence, or None), first_piece `[N]` int64,
        bwd_pass_cu / bwd_pass_chunk_offsets `[p_hi - p_lo + 1]` int32 (chunk offsets absolute, as
            the forward's pass1 table), bwd_piece_start / bwd_piece_end `[p_hi - p_lo]` int64,
        bwd_needs_m `[p_hi - p_lo]` bool: the piece's transition enters the chain (neither first nor
            last in its sequence),
        bwd_trunc `[p_hi - p_lo]` int64: 1 where the local pass may stop early (the piece is neither
            first nor last: a last piece carries the user's dht, a first piece's result is unused),
            bwd_skip_all `[p_hi - p_lo]` int64: the chunk count of first pieces (no work), else 0,
            bwd_fwd_last / bwd_fwd_valid `[p_hi - p_lo, Lf]` int64 / bool: the last token of chunk r
            of each piece counted from its start (Lf = most chunks of a range piece), for the local
            pass's truncation (backward_cp.local_skips),
        bwd_fwd_last32 `[p_hi - p_lo, Lf]` int32 (bwd_fwd_last with -1 where not valid) and bwd_piece32
            `[p_hi - p_lo, 2]` int32 (n_chunks, 0 first piece: skip all / 1 middle: may stop early / 2 last:
            never): the local pass's truncation as common/cp_tables.py reads it,
        bwd_m_rows `[p_hi - p_lo + 1]` int32 (None without pass1): the row of the forward chain's
            transitions (`forward_cp.PieceTransitions`, rows of pass1 plus a zero-flag row P1) that each
            range row enters the backward chain with: P1 where it does not (first and last pieces,
            pieces outside pass1, the range's zero row),
        bwd_slot_msrc32 `[max(n_slots - 2, 0), n_long]` int32 (None without pass1): bwd_m_rows[bwd_slot_src],
            the forward chain's row each backward chain step reads (cp_correct's msrc),
        bwd_slot_src32: bwd_slot_src as int32 (what cp_correct reads),
        bwd_slot_first `[n_long]` int32: range row of the last piece of long sequence l (cp_correct's init_rows in
            the backward),
        bwd_slot_src `[max(n_slots - 2, 0), n_long]` int64: for chain step s, the range row of
            piece (last - 1 - s) of long sequence l, or p_hi - p_lo (an extra row of any value: such a step's
            output goes to the scratch row P) once that piece would be the sequence's first,
        slot_rows32 `[n_slots, n_long]` int32 (None without pass1) / bwd_slot_rows32 `[n_slots - 1, n_long]` int32:
            the piece row cp_correct writes chain output s of long sequence l to in the forward (piece
            first + s: its initial state) / the backward (piece last - 1 - s: its terminal gradient), P (a
            scratch row past the pieces) where the sequence has no such piece,
        piece_order `[P]` / bwd_pass_order `[p_hi - p_lo]` int32: the order the chunk recurrences dispatch the pieces
            (of the local reverse pass's range) in (common/bwd_h.sequence_block; the forward's recurrences read
            piece_order, its first P1 rows for the pass-1 range): token order.
            Longest first measured slower here (session 25: hk4_hv8 32k_2seq 1.04x), where the plain
            backward's sequences gain from it (`ChunkTable.seq_order`).
        fused_chains `[P, 4]` int32: hopper/bwd_fused's chain table, (bos, eos, first chunk row, piece) per piece,
            longest first (ties in token order): its order is the fused kernel's dispatch order (one block per SM
            walks a whole piece, so the long walks go first; `backward.fused_chains` for the plain path).
    """

    enabled: bool
    piece_chunks: int
    chunk_size: int
    n_seqs: int
    pieces: tuple[tuple[int, int, int], ...]
    pass1: tuple[int, int] | None
    n_slots: int
    long_seqs: tuple[int, ...]
    cu_pieces: torch.Tensor
    chunk_offsets: torch.Tensor
    piece_seq: torch.Tensor
    is_first: torch.Tensor
    is_last: torch.Tensor
    last_piece: torch.Tensor
    pass1_cu: torch.Tensor | None
    pass1_chunk_offsets: torch.Tensor | None
    piece_start: torch.Tensor | None
    piece_end: torch.Tensor | None
    slot_src: torch.Tensor | None
    slot_seq: torch.Tensor | None
    first_piece: torch.Tensor | None = None
    bwd_pass: tuple[int, int] | None = None
    bwd_pass_cu: torch.Tensor | None = None
    bwd_pass_chunk_offsets: torch.Tensor | None = None
    bwd_piece_start: torch.Tensor | None = None
    bwd_piece_end: torch.Tensor | None = None
    bwd_needs_m: torch.Tensor | None = None
    bwd_trunc: torch.Tensor | None = None
    bwd_skip_all: torch.Tensor | None = None
    piece_order: torch.Tensor | None = None
    bwd_pass_order: torch.Tensor | None = None
    bwd_fwd_last: torch.Tensor | None = None
    bwd_fwd_valid: torch.Tensor | None = None
    bwd_slot_first: torch.Tensor | None = None
    bwd_slot_src: torch.Tensor | None = None
    bwd_slot_src32: torch.Tensor | None = None
    bwd_fwd_last32: torch.Tensor | None = None
    bwd_piece32: torch.Tensor | None = None
    bwd_m_rows: torch.Tensor | None = None
    bwd_slot_msrc32: torch.Tensor | None = None
    pass1_n_chunks: torch.Tensor | None = None
    pass1_needed: torch.Tensor | None = None
    pass1_rev_last: torch.Tensor | None = None
    pass1_rev_valid: torch.Tensor | None = None
    pass1_rev_last32: torch.Tensor | None = None
    pass1_piece32: torch.Tensor | None = None
    fused_chains: torch.Tensor | None = None
    slot_rows32: torch.Tensor | None = None
    bwd_slot_rows32: torch.Tensor | None = None
    first_span: tuple[int, int] | None = None
    dht_src32: torch.Tensor | None = None

    @property
    def n_pieces(self) -> int:
        return len(self.pieces)

    def first_rows(self, x: torch.Tensor) -> torch.Tensor:
        """x[first_piece] (`[P, ...]` per-piece rows -> `[N, ...]` the sequences' first pieces): a view, no launch,
        when those pieces are consecutive rows (``first_span``: one sequence, or one piece each), else a gather."""
        if self.first_span is not None:
            return x[self.first_span[0]:self.first_span[1]]
        return x[self.first_piece]

    @property
    def seq_tokens(self) -> list[int]:
        """Tokens of each sequence (the sum of its pieces)."""
        tokens = [0] * self.n_seqs
        for bos, eos, seq in self.pieces:
            tokens[seq] += eos - bos
        return tokens

    @property
    def pass1_wasted(self) -> int:
        """Pieces inside the local pass's range that are last in their sequence (their result is not
        read; the kernel runs a contiguous range of pieces)."""
        if self.pass1 is None:
            return 0
        lo, hi = self.pass1
        last = {p for p in range(lo, hi) if p + 1 == len(self.pieces) or self.pieces[p + 1][2] != self.pieces[p][2]}
        return len(last)


def build_plan(cu: list[int], piece_chunks: int | None, chunk_size: int, device) -> CPPlan:
    """The plan for host boundaries ``cu`` with pieces of ``piece_chunks`` chunks (None: CP off,
    every sequence one piece). Pure host work plus one upload per table."""
    C = chunk_size
    L = piece_chunks
    pieces: list[tuple[int, int, int]] = []
    for n, (bos, eos) in enumerate(itertools.pairwise(cu)):
        if L is not None and -(-(eos - bos) // C) > L:
            pieces.extend((s, min(s + L * C, eos), n) for s in range(bos, eos, L * C))
        else:
            pieces.append((bos, eos, n))
    N = len(cu) - 1
    P = len(pieces)
    seq = [p[2] for p in pieces]
    is_first = [j == 0 or seq[j - 1] != seq[j] for j in range(P)]
    is_last = [j == P - 1 or seq[j + 1] != seq[j] for j in range(P)]
    counts = [0] * N
    for n in seq:
        counts[n] += 1
    first = [0] * N
    last = [0] * N
    for j, n in enumerate(seq):
        if is_first[j]:
            first[n] = j
        if is_last[j]:
            last[n] = j
    offsets = [0]
    for bos, eos, _ in pieces:
        offsets.append(offsets[-1] + -(-(eos - bos) // C))
    cu_pieces = [pieces[0][0]] + [p[1] for p in pieces] if P else [0]

    long_seqs = tuple(n for n in range(N) if counts[n] > 1)
    n_slots = max((counts[n] for n in long_seqs), default=0)
    non_last = [j for j in range(P) if not is_last[j]]
    pass1 = (non_last[0], non_last[-1] + 1) if non_last else None

    def up(x, dtype):
        return torch.tensor(x, dtype=dtype, device=device)

    i32, i64 = torch.int32, torch.int64
    pass1_cu = pass1_off = piece_start = piece_end = slot_src = slot_seq = None
    warm: dict = {}
    if pass1 is not None:
        lo, hi = pass1
        pass1_cu = up(cu_pieces[lo:hi + 1], i32)
        pass1_off = up(offsets[lo:hi + 1], i32)
        piece_start = up([pieces[j][0] for j in range(lo, hi)], i64)
        piece_end = up([pieces[j][1] for j in range(lo, hi)], i64)
        n_chunks = [-(-(pieces[j][1] - pieces[j][0]) // C) for j in range(lo, hi)]
        Lr = max(max(n_chunks), 1)
        rev = [[min(pieces[j][0] + (m - r) * C, pieces[j][1]) - 1 if r < m else 0 for r in range(Lr)]
               for j, m in zip(range(lo, hi), n_chunks)]
        valid = [[r < m for r in range(Lr)] for m in n_chunks]
        warm = {
            "pass1_n_chunks": up(n_chunks, i64),
            "pass1_needed": up([not is_last[j] for j in range(lo, hi)], torch.bool),
            "pass1_rev_last": up(rev, i64).reshape(hi - lo, Lr),
            "pass1_rev_valid": up(valid, torch.bool).reshape(hi - lo, Lr),
            # the same tables as common/cp_tables.py reads them: -1 past a piece's chunks; (m_j, needed)
            "pass1_rev_last32": up([[x if r < m else -1 for r, x in enumerate(row)] for row, m in zip(rev, n_chunks)],
                                   i32).reshape(hi - lo, Lr),
            "pass1_piece32": up([[m, int(not is_last[j])] for j, m in zip(range(lo, hi), n_chunks)],
                                i32).reshape(hi - lo, 2),
        }
        zero_row = hi - lo
        src = [[first[n] + s - lo if s < counts[n] - 1 else zero_row for n in long_seqs]
               for s in range(n_slots - 1)]
        slot_src = up(src, i32).reshape(n_slots - 1, len(long_seqs))
        slot_seq = up(list(long_seqs), i32)
        # cp_correct writes chain output s of long sequence l straight into its piece's row (P: a scratch row)
        warm["slot_rows32"] = up([[first[n] + s if s < counts[n] else P for n in long_seqs] for s in range(n_slots)],
                                 i32).reshape(n_slots, len(long_seqs))
    # Backward: the reverse chain over pieces that are not first in their sequence.
    nl = len(long_seqs)
    non_first = [j for j in range(P) if not is_first[j]]
    bwd_pass = (non_first[0], non_first[-1] + 1) if non_first else None
    bwd: dict = {"bwd_pass": bwd_pass}
    if bwd_pass is not None:
        lo, hi = bwd_pass
        zero_row = hi - lo
        Lf = max(max(-(-(pieces[j][1] - pieces[j][0]) // C) for j in range(lo, hi)), 1)
        bwd.update(
            bwd_pass_cu=up(cu_pieces[lo:hi + 1], i32), bwd_pass_chunk_offsets=up(offsets[lo:hi + 1], i32),
            bwd_pass_order=up(list(range(hi - lo)), i32),
            bwd_piece_start=up([pieces[j][0] for j in range(lo, hi)], i64),
            bwd_piece_end=up([pieces[j][1] for j in range(lo, hi)], i64),
            bwd_needs_m=up([not is_first[j] and not is_last[j] for j in range(lo, hi)], torch.bool),
            bwd_trunc=up([int(not is_first[j] and not is_last[j]) for j in range(lo, hi)], i64),
            bwd_skip_all=up([-(-(pieces[j][1] - pieces[j][0]) // C) if is_first[j] else 0 for j in range(lo, hi)],
                            i64),
            bwd_fwd_last=up([[min(pieces[j][0] + (r + 1) * C, pieces[j][1]) - 1
                              if pieces[j][0] + r * C < pieces[j][1] else 0 for r in range(Lf)]
                             for j in range(lo, hi)], i64).reshape(hi - lo, Lf),
            bwd_fwd_valid=up([[pieces[j][0] + r * C < pieces[j][1] for r in range(Lf)] for j in range(lo, hi)],
                             torch.bool).reshape(hi - lo, Lf),
            bwd_slot_first=up([last[n] - lo for n in long_seqs], i32),
            bwd_slot_src=up([[last[n] - 1 - s - lo if s <= counts[n] - 3 else zero_row for n in long_seqs]
                             for s in range(n_slots - 2)], i64).reshape(max(n_slots - 2, 0), nl),
        )
        bwd["bwd_slot_src32"] = bwd["bwd_slot_src"].to(i32)
        # chain output s of long sequence l: the terminal gradient of piece last - 1 - s (P: a scratch row)
        bwd["bwd_slot_rows32"] = up([[last[n] - 1 - s if s <= counts[n] - 2 else P for n in long_seqs]
                                     for s in range(n_slots - 1)], i32).reshape(max(n_slots - 1, 0), nl)
        m_b = [-(-(pieces[j][1] - pieces[j][0]) // C) for j in range(lo, hi)]
        bwd["bwd_fwd_last32"] = up([[min(pieces[j][0] + (r + 1) * C, pieces[j][1]) - 1 if r < m else -1
                                     for r in range(Lf)] for j, m in zip(range(lo, hi), m_b)], i32).reshape(hi - lo, Lf)
        bwd["bwd_piece32"] = up([[m, 0 if is_first[j] else (2 if is_last[j] else 1)]
                                 for j, m in zip(range(lo, hi), m_b)], i32).reshape(hi - lo, 2)
        if pass1 is not None:
            p1_lo, p1_hi = pass1
            n1 = p1_hi - p1_lo
            bwd["bwd_m_rows"] = up([j - p1_lo if p1_lo <= j < p1_hi and not is_first[j] and not is_last[j] else n1
                                    for j in range(lo, hi)] + [n1], i32)
            bwd["bwd_slot_msrc32"] = bwd["bwd_m_rows"][bwd["bwd_slot_src"]].contiguous()
    by_length = sorted(range(P), key=lambda j: offsets[j] - offsets[j + 1])  # longest first, stable
    fused = [[pieces[j][0], pieces[j][1], offsets[j], j] for j in by_length]
    return CPPlan(
        enabled=pass1 is not None, piece_chunks=L or 0, chunk_size=C, n_seqs=N, pieces=tuple(pieces),
        pass1=pass1, n_slots=n_slots, long_seqs=long_seqs,
        cu_pieces=up(cu_pieces, i32), chunk_offsets=up(offsets, i32), piece_seq=up(seq, i64),
        is_first=up(is_first, torch.bool), is_last=up(is_last, torch.bool), last_piece=up(last, i64),
        pass1_cu=pass1_cu, pass1_chunk_offsets=pass1_off, piece_start=piece_start, piece_end=piece_end,
        slot_src=slot_src, slot_seq=slot_seq, first_piece=up(first, i64),
        first_span=(first[0], first[0] + N) if N and first == list(range(first[0], first[0] + N)) else None,
        piece_order=up(list(range(P)), i32), fused_chains=up(fused, i32).reshape(P, 4),
        dht_src32=up([seq[j] if is_last[j] else -1 for j in range(P)], i32), **bwd, **warm,
    )


_PLANS: dict = {}
_MAX_PLANS = 32


def _capturing(device) -> bool:
    return torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()


def plan_cp(cu_seqlens: torch.Tensor | None, *, heads: int, sm_count: int, chunk_size: int, B: int = 1,
            T: int | None = None, device=None, alpha: float = ALPHA, min_piece_chunks: int = MIN_PIECE_CHUNKS,
            piece_chunks: int | None = None, enable: bool | None = None) -> CPPlan:
    """The (cached) CP plan of a call.

    Args:
        cu_seqlens: `[N + 1]` boundaries (host values are read once per tensor and remembered), or
            None for B dense sequences of T tokens.
        heads: planning head count: H_v of the call, or the model's global head count under tensor
            parallelism (then every rank gets the same split).
        sm_count, chunk_size: of the device / arch.
        piece_chunks: force L (chunks per piece) instead of the model's choice.
        enable: force CP on (True) or off (False) instead of the enable rule.

    Raises:
        RuntimeError: inside a CUDA-graph capture when this plan was not made before the capture.
    """
    device = torch.device(device if device is not None else
                          (cu_seqlens.device if cu_seqlens is not None else "cpu"))
    if cu_seqlens is None:
        if T is None:
            raise ValueError("plan_cp needs T for dense input (cu_seqlens None)")
        cu = [b * T for b in range(B + 1)]
    else:
        cu = _host_values(cu_seqlens)
        if cu is None:
            raise RuntimeError("CP plan needed inside a CUDA-graph capture for a cu_seqlens tensor "
                               "not seen before: call once eagerly (or plan_cp) before capturing")
    key = (tuple(cu), heads, sm_count, chunk_size, alpha, min_piece_chunks, piece_chunks, enable, str(device))
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    if _capturing(device):
        raise RuntimeError("CP plan needed inside a CUDA-graph capture but not made before it: call "
                           "once eagerly (or plan_cp with the same arguments) before capturing")
    lengths = [b - a for a, b in itertools.pairwise(cu)]
    on, L = choose_piece_chunks(lengths, heads, sm_count, chunk_size, alpha=alpha,
                                min_piece_chunks=min_piece_chunks)
    if piece_chunks is not None:
        if piece_chunks < 1:
            raise ValueError(f"piece_chunks must be positive, got {piece_chunks}")
        L = piece_chunks
    if enable is not None:
        on = enable
    plan = build_plan(cu, L if on else None, chunk_size, device)
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.pop(next(iter(_PLANS)))
    _PLANS[key] = plan
    return plan
