"""cp_tables: the CP forward's warm-up tables in one launch (launch (b) of forward_cp.py).

For every local-pass piece j and v-head h, walking the piece's chunks back from its end and summing their
total log-decays gam_C (g_cumsum on each chunk's last token; fp64 running sum), n(j, h) is the first count
at which the sum drops below ``threshold``; the head falls back when it never does (or without a
threshold) and the piece's states enter the chain (``needed``). Outputs, int32:
    skip_local[j, h] = m_j - n (reached), 0 (fallback), m_j (piece not needed: no work)
    skip_m[j, h]     = 0 (fallback), else m_j (the transition pass does nothing there)
    flag[j, h]       = fallback; row P1 is zero (the chain's zero slot)
``needed`` = 2 (the backward's last pieces, which carry the sequence's dht) runs every chunk: skip_local = 0.
The backward's local pass walks its pieces from the start instead (``direction="backward"``: the plan's bwd_*32
tables, the same scan): skip_local is then backward_cp.local_skips.
The same values as forward_cp.warmup_skips (torch: a gather, where, cumsum, compare, cumprod, sum and
casts, ~15 launches, each a 1.5-2.5 us slot inside a CUDA graph; results/h200/NOTES.md, session 11).

Grid: one block per local-pass piece; 128 threads. The piece's chunk-end rows of g_cumsum are staged in
shared memory R = 64 at a time ([R, H] fp32, loaded coalesced over heads, 0 past the piece's chunks), then
one thread per head scans them, heads looped in steps of 128 (per-head state in registers).
Shared memory: R x H x 4 bytes (16 KB at H = 64).
"""

import functools

import tilelang.language as T
import torch

from .build import compile_for

R = 64  # chunk-end rows staged per step
THREADS = 128


@functools.cache
def cp_tables_kernel(H: int, arch: str):
    HB = -(-H // THREADS)
    n_tok = T.dynamic("n_tok")
    n_p = T.dynamic("n_p")
    n_r = T.dynamic("n_r")
    n_f = T.dynamic("n_f")

    @T.prim_func
    def cp_tables(
        g_cumsum: T.Tensor((n_tok, H), "float32"),
        rev_last: T.Tensor((n_p, n_r), "int32"),
        piece: T.Tensor((n_p, 2), "int32"),
        skip_local: T.Tensor((n_p, H), "int32"),
        skip_m: T.Tensor((n_p, H), "int32"),
        flag: T.Tensor((n_f, H), "int32"),
        threshold: T.float32,
        has_threshold: T.int32,
    ):
        with T.Kernel(n_p, threads=THREADS) as j:
            tx = T.get_thread_binding()
            tile = T.alloc_shared((R, H), "float32")
            s = T.alloc_local((HB,), "float64")
            first = T.alloc_local((HB,), "int32")
            m = piece[j, 0]
            needed = piece[j, 1]
            for b in T.serial(HB):
                s[b] = 0.0
                first[b] = n_r
            for t in T.serial(T.ceildiv(n_r, R)):
                for i, hh in T.Parallel(R, H):
                    r = t * R + i
                    tok = T.if_then_else(r < n_r, rev_last[j, T.min(r, n_r - 1)], -1)
                    tile[i, hh] = T.if_then_else(tok >= 0, g_cumsum[T.max(tok, 0), hh], 0.0)
                for b in T.serial(HB):
                    hh = b * THREADS + tx
                    if hh < H:
                        for i in T.serial(R):
                            s[b] = s[b] + T.cast(tile[i, hh], "float64")
                            if s[b] < T.cast(threshold, "float64") and first[b] == n_r:
                                first[b] = t * R + i
            for b in T.serial(HB):
                hh = b * THREADS + tx
                if hh < H:
                    reached = has_threshold != 0 and first[b] < n_r and needed == 1
                    fallback = needed != 0 and not reached
                    skip_local[j, hh] = T.if_then_else(needed != 0, T.if_then_else(reached, m - first[b] - 1, 0), m)
                    skip_m[j, hh] = T.if_then_else(fallback, 0, m)
                    flag[j, hh] = T.if_then_else(fallback, 1, 0)
                    if j == 0:
                        flag[n_f - 1, hh] = 0

    return compile_for(cp_tables, arch)


def cp_tables(plan, g_cumsum: torch.Tensor, decay_threshold: float | None, arch: str, direction: str = "forward"):
    """(skip_local `[P1, H]`, skip_m `[P1, H]`, flag `[P1 + 1, H]`) int32 for ``plan``'s local-pass pieces,
    from the in-chunk cumsum g_cumsum `[n_tok, H]` fp32 (one launch, no host sync). ``direction="backward"``:
    the same over the backward's local reverse pass (plan.bwd_pass; only skip_local is meaningful there)."""
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
    last, piece = ((plan.pass1_rev_last32, plan.pass1_piece32) if direction == "forward"
                   else (plan.bwd_fwd_last32, plan.bwd_piece32))
    P1, H = piece.shape[0], g_cumsum.shape[1]
    dev = g_cumsum.device
    skip_local = torch.empty(P1, H, dtype=torch.int32, device=dev)
    skip_m = torch.empty(P1, H, dtype=torch.int32, device=dev)
    flag = torch.empty(P1 + 1, H, dtype=torch.int32, device=dev)
    cp_tables_kernel(H, arch)(g_cumsum, last, piece, skip_local, skip_m, flag,
                              float(decay_threshold) if decay_threshold is not None else 0.0,
                              int(decay_threshold is not None))
    return skip_local, skip_m, flag
