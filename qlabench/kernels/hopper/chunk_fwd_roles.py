"""The roles the warp-specialized forward recurrences share (hopper/chunk_fwd_ws.py and
hopper/chunk_fwd_wy.py differ only in how the state warpgroup forms Vd, and wy's extra warpgroup).

Built per compile-time configuration by ``roles(C, K, BV, dtype, state_v_first)``, as TileLang macros
that inline where the kernel calls them (the generated code is the same as with the bodies written in
place):
  * handoff_vd: the state's Vd and r-scaled Vr from its accumulator into their hand-off tiles.
  * block_run: the block's sequence n (seq_order[row]: the host's dispatch order, longest first), v-head h, qk-head hk, first V column v0, tokens [bos, eos), the
    chunks it skips (chunk_skip, has_skip) and runs (n_run, in n_pairs ring pairs).
  * produce: the TMA producer's step for chunk c into ring slot c % 2: wait empty[slot], TMA K, V, Ag
    (the state chain's inputs) on full[slot] and Q, Pm (the output's) on full_o[slot], the chunk's gam
    rows (g_cumsum, the last real row repeated past eos), arrive on both. The chain no longer waits for
    the output's 24 KB: chunk_fwd_wy 949 -> 909 us at hk16_hv64 1x32768 (H200, session 14).
  * producer_role / output_role: those warpgroups' whole loops, the chunks in ring pairs (slot 0 then
    slot 1; ``ring0`` / ``ring1`` = the slots' (Q, K, V, Ag, Pm, gam) tiles, ``hand0`` / ``hand1`` the
    state's (S, Vd) hand-off tiles by chunk parity), the output's ending with finish_output.
  * output_step: the output warpgroup's step, O = scale diag(e) Q S + Pm Vd with S, Vd from the state
    warpgroup (s_ready, vd_ready), the optional per-chunk h rows, then O of a whole chunk through shared
    memory and one TMA store (BAR_OUTPUT guards O_s), a partial last chunk row by row. With ``pm_on_chip``
    (chunk_fwd_v128) it first forms Pm = scale Gam .* Q K^T into the ring slot's P tile itself (no Pm load).
  * load_state / store_state: S from h0 (or 0) into the state fragment, and the final S into ht.
  * finish_output: the last TMA store drained; the last sequence's block zeroes o's padding tail.
"""

from __future__ import annotations

from typing import NamedTuple

import tilelang.language as T

from ..common.chunk_fwd import start_state
from ..common.kkt_solve import mask_pm

BAR_OUTPUT = 2  # the output warpgroup's named barrier: O_s free before it is rewritten, written before the TMA store


class Roles(NamedTuple):
    handoff_vd: object
    block_run: object
    produce: object
    producer_role: object
    output_step: object
    output_role: object
    load_state: object
    store_state: object
    finish_output: object


def roles(C: int, K: int, BV: int, dtype: str, state_v_first: bool, pm_on_chip: bool = False) -> Roles:
    """The shared macros for chunk size C, key width K, V tile BV, the inputs' dtype and state layout.
    ``pm_on_chip``: the output warpgroup forms Pm = scale Gam .* Q K^T itself into the ring slot's P tile (no
    Pm load; kkt_solve runs without Pm, forward.forms_pm), as chunk_fwd_v128 does."""

    @T.macro
    def handoff_vd(U_f, gam_s, Vd_s, Vr_s, t0, eos):
        """The state's Vd (in U_f) and Vr = diag(exp(gam_C - gam)) Vd to their hand-off tiles, each formed
        in place on the (then dead) accumulator and copied whole (stmatrix), not as element-wise 2-byte
        stores from the fragment layout; rows past eos are zero (a select: other data there)."""
        for i, j in T.Parallel(C, BV):
            U_f[i, j] = T.if_then_else(t0 + i < eos, U_f[i, j], 0.0)
        T.copy(U_f, Vd_s)
        for i, j in T.Parallel(C, BV):
            U_f[i, j] = T.if_then_else(t0 + i < eos, T.exp(gam_s[C - 1] - gam_s[i]) * U_f[i, j], 0.0)
        T.copy(U_f, Vr_s)

    @T.macro
    def block_run(cu_seqlens, seq_order, chunk_skip, has_skip, iv, nh, h_v: int, group: int):
        n = seq_order[nh // h_v]
        h = nh % h_v
        hk = h // group
        v0 = iv * BV
        bos = cu_seqlens[n]
        eos = cu_seqlens[n + 1]
        # first chunk run; the row index is guarded too, so a [1, H_v] dummy is never over-read
        skip_row = T.if_then_else(has_skip != 0, n, 0)
        skip = T.max(T.if_then_else(has_skip != 0, chunk_skip[skip_row, h], 0), 0)
        n_run = T.max(T.ceildiv(eos - bos, C) - skip, 0)
        n_pairs = T.ceildiv(n_run, 2)
        return n, h, hk, v0, bos, eos, skip, n_run, n_pairs

    @T.macro
    def produce(slot: int, c, n_run, bos, eos, skip, h, hk, v0, tx, q, k, v, g_cumsum, Ag, Pm,
                Q_s, K_s, V_s, Ag_s, P_s, gam_s, full, full_o, empty):
        if c < n_run:
            T.mbarrier_wait_parity(empty[slot], ((c // 2) & 1) ^ 1)
            t0 = bos + (skip + c) * C
            # the state chain's inputs first, on their own barrier: the chain starts before Q, Pm (the
            # output's) have landed
            T.tma_copy(k[t0:t0 + C, hk, :], K_s, barrier=full[slot])
            T.tma_copy(v[t0:t0 + C, h, v0:v0 + BV], V_s, barrier=full[slot])
            T.tma_copy(Ag[t0:t0 + C, h, :], Ag_s, barrier=full[slot])
            T.tma_copy(q[t0:t0 + C, hk, :], Q_s, barrier=full_o[slot])
            if not pm_on_chip:
                T.tma_copy(Pm[t0:t0 + C, h, :], P_s, barrier=full_o[slot])
            if tx < C:
                gam_s[tx] = g_cumsum[T.min(t0 + tx, eos - 1), h]
            T.mbarrier_arrive(full[slot])
            T.mbarrier_arrive(full_o[slot])

    @T.macro
    def output_step(slot: int, c, n_run, bos, eos, skip, n, h, v0, scale, store_h, chunk_offsets, h_out, o,
                    Q_s, P_s, gam_s, S_s, Vd_s, O_f, O_s, full_o, empty, s_ready, vd_ready, o_free, K_s=None,
                    P_f=None, full=None):
        if c < n_run:
            ph = (c // 2) & 1
            t0 = bos + (skip + c) * C
            T.mbarrier_wait_parity(full_o[slot], ph)
            if pm_on_chip:
                # Pm = scale Gam .* Q K^T into the slot's P tile, before S is ready (off the state chain; one
                # C x C fragment live, not beside O). Rows of K past eos (the next sequence, or zeros past the
                # tensor; the value warpgroup may be zeroing them meanwhile) meet only entries j > i of the
                # chunk's rows, removed by the select, or rows past eos, never stored.
                T.mbarrier_wait_parity(full[slot], ph)
                T.gemm(Q_s, K_s, P_f, transpose_B=True, clear_accum=True)
                mask_pm(P_f, gam_s, scale, C)
                T.copy(P_f, P_s)
                T.fence_proxy_async()
                T.sync_threads(BAR_OUTPUT, 128)
            T.mbarrier_wait_parity(s_ready[slot], ph)
            T.gemm(Q_s, S_s, O_f, clear_accum=True)
            for i, j in T.Parallel(C, BV):
                O_f[i, j] = O_f[i, j] * (scale * T.exp(gam_s[i]))
            if store_h != 0:
                for i, j in T.Parallel(K, BV):
                    if state_v_first:
                        h_out[chunk_offsets[n] + skip + c, h, v0 + j, i] = S_s[i, j]
                    else:
                        h_out[chunk_offsets[n] + skip + c, h, i, v0 + j] = S_s[i, j]
            T.mbarrier_wait_parity(vd_ready[slot], ph)
            T.gemm(P_s, Vd_s, O_f)
            T.mbarrier_arrive(o_free[slot])
            T.mbarrier_arrive(empty[slot])
            if t0 + C <= eos:
                # a whole chunk: O through shared memory and one TMA store (coalesced rows; the
                # registers are free at once). The previous store has read O_s before it is rewritten.
                T.tma_store_wait(0)
                T.sync_threads(BAR_OUTPUT, 128)
                T.copy(O_f, O_s)
                T.fence_proxy_async()
                T.sync_threads(BAR_OUTPUT, 128)
                T.tma_copy(O_s, o[t0:t0 + C, h, v0:v0 + BV])
            else:  # the sequence's last, partial chunk: only its rows (the next sequence owns the rest)
                for i, j in T.Parallel(C, BV):
                    if t0 + i < eos:
                        o[t0 + i, h, v0 + j] = T.cast(O_f[i, j], dtype)

    @T.macro
    def producer_role(n_pairs, n_run, bos, eos, skip, h, hk, v0, tx, q, k, v, g_cumsum, Ag, Pm, ring0, ring1,
                      full, full_o, empty):
        for p in T.serial(n_pairs):
            produce(0, 2 * p, n_run, bos, eos, skip, h, hk, v0, tx, q, k, v, g_cumsum, Ag, Pm, *ring0, full, full_o,
                    empty)
            produce(1, 2 * p + 1, n_run, bos, eos, skip, h, hk, v0, tx, q, k, v, g_cumsum, Ag, Pm, *ring1, full,
                    full_o, empty)

    @T.macro
    def load_state(S_f, h0, has_h0, n, h, v0):
        for i, j in T.Parallel(K, BV):
            S_f[i, j] = start_state(h0, has_h0, n, h, v0, i, j, state_v_first)

    @T.macro
    def store_state(S_f, ht, n, h, v0):
        for i, j in T.Parallel(K, BV):
            if state_v_first:
                ht[n, h, v0 + j, i] = S_f[i, j]
            else:
                ht[n, h, i, v0 + j] = S_f[i, j]

    @T.macro
    def finish_output(o, n, n_cu, eos, n_tok, h, v0):
        T.tma_store_wait(0)
        if n == n_cu - 2:
            for c in T.serial(T.ceildiv(n_tok - eos, C)):
                for i, j in T.Parallel(C, BV):
                    if eos + c * C + i < n_tok:
                        o[eos + c * C + i, h, v0 + j] = T.cast(0, dtype)

    @T.macro
    def output_role(n_pairs, n_run, bos, eos, skip, n, n_cu, n_tok, h, v0, scale, store_h, chunk_offsets, h_out,
                    o, ring0, ring1, hand0, hand1, O_f, O_s, full_o, empty, s_ready, vd_ready, o_free, P_f=None,
                    full=None):
        for p in T.serial(n_pairs):
            output_step(0, 2 * p, n_run, bos, eos, skip, n, h, v0, scale, store_h, chunk_offsets, h_out, o,
                        ring0[0], ring0[4], ring0[5], *hand0, O_f, O_s, full_o, empty, s_ready, vd_ready, o_free,
                        ring0[1], P_f, full)
            output_step(1, 2 * p + 1, n_run, bos, eos, skip, n, h, v0, scale, store_h, chunk_offsets, h_out, o,
                        ring1[0], ring1[4], ring1[5], *hand1, O_f, O_s, full_o, empty, s_ready, vd_ready, o_free,
                        ring1[1], P_f, full)
        finish_output(o, n, n_cu, eos, n_tok, h, v0)

    return Roles(handoff_vd, block_run, produce, producer_role, output_step, output_role, load_state, store_state,
                 finish_output)
