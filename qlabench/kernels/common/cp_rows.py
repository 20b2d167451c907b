"""cp_dht_rows: the CP backward's piece terminal-gradient rows in one launch (backward_cp._reverse_passes).

Formula, per piece j of the plan and v-head h (src = plan.dht_src32: the piece's sequence where the piece is its
sequence's last, -1 elsewhere):

    rows[j, h] = dht[src[j], h]     (src[j] >= 0: a last piece carries its sequence's end gradient)
    rows[j, h] = 0                  (src[j] < 0: the local reverse pass starts a middle piece from zero; the chain
                                     writes every non-last piece's row after it)

The same rows as torch.zeros + index_copy_ (`dht_rows_torch`, the CPU twins' form): two launches, H100 session 46
(results/h200/2026-12-06_s46/call2/split-summary.txt): the fill 1.5-6 us and the index copy 4-9.5 us of every CP row
of h200-bwd (the index copy moves 4-byte elements with per-element index math). This kernel in their place, H100,
session 47 (results/h200/2026-12-06_s47/call1, h200-bwd phase bwd, two runs in opposite orders): 0.989 / 0.990 of the
backward's time, 9 / 8 of the 24 CP rows faster, none slower. (The dh0 gather of multi-sequence plans by the same
kernel measured flat, 1.000 / 1.002: call2, branch wip/s47-dh0-gather, not landed.)

Grid: (P, H_v), one block per (piece, v-head) state tile (K x V fp32 = 64 KB); 128 threads, each moving 16-byte
vectors. No shared memory. Rows past P (the chain's scratch row) are not written.
"""

import functools

import tilelang.language as T
import torch

from .build import compile_for

THREADS = 128


@functools.cache
def dht_rows_kernel(H: int, K: int, V: int, arch: str):
    n_seq = T.dynamic("n_seq")
    n_p = T.dynamic("n_p")
    n_out = T.dynamic("n_out")

    @T.prim_func
    def cp_dht_rows(
        dht: T.Tensor((n_seq, H, K, V), "float32"),
        src: T.Tensor((n_p,), "int32"),
        rows: T.Tensor((n_out, H, K, V), "float32"),
    ):
        with T.Kernel(n_p, H, threads=THREADS) as (j, h):
            s = src[j]
            for i, v in T.Parallel(K, V):
                rows[j, h, i, v] = T.if_then_else(s >= 0, dht[T.max(s, 0), h, i, v], 0.0)

    return compile_for(cp_dht_rows, arch)


def dht_rows(dht: torch.Tensor, src: torch.Tensor, rows: torch.Tensor, arch: str) -> None:
    """rows[:P] = the pieces' terminal gradients (module docstring) from the sequences' ``dht`` `[N, H, K, V]` fp32 and
    ``src`` `[P]` int32 (plan.dht_src32); ``rows`` `[P + extra, H, K, V]` fp32, rows past P untouched."""
    H, K, V = dht.shape[1:]
    dht_rows_kernel(H, K, V, arch)(dht, src, rows)


def dht_rows_torch(dht: torch.Tensor, src: torch.Tensor, rows: torch.Tensor, arch: str | None = None) -> None:
    """`dht_rows` in torch (the CPU twins' form): the old fill + index copy, rows past P untouched."""
    P = src.shape[0]
    rows[:P].zero_()
    last = (src >= 0).nonzero().flatten()
    rows.index_copy_(0, last, dht[src[last].long()])
