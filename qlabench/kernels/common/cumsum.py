"""In-chunk cumulative sum of the log-gate (fp32), forward or reverse.

Formula: gam[t] = sum_{s in chunk(t), s <= t} g[s]   (reverse: sum over s >= t).
Grid: one block per chunk (chunk table bound NCmax; rows past the real chunk count exit), all H
heads of the chunk in that block. Threads: the block loads the chunk's [C, H] tile of g into shared
memory in parallel (coalesced over heads; rows past the chunk end read as 0), then one thread per
head scans its column in shared memory in fp32 (heads looped in steps of the block size), then the
block stores the rows inside the chunk. Shared memory: C x H x 4 bytes (16 KB at C = 64, H = 64).
(The first version scanned straight from global memory: 64 dependent load-add-store steps per
thread, ~28 us per call at any size on the H200.)
"""


import functools

import tilelang.language as T
import torch

from .build import compile_for


@functools.cache
def chunk_local_cumsum_kernel(H: int, C: int, reverse: bool, arch: str):
    threads = 128
    n_tok = T.dynamic("n_tok")
    n_chunks = T.dynamic("n_chunks")

    @T.prim_func
    def chunk_local_cumsum(
        g: T.Tensor((n_tok, H), "float32"),
        chunk_bounds: T.Tensor((n_chunks, 2), "int32"),
        out: T.Tensor((n_tok, H), "float32"),
    ):
        with T.Kernel(n_chunks, threads=threads) as c:
            tx = T.get_thread_binding()
            start = chunk_bounds[c, 0]
            end = chunk_bounds[c, 1]
            tile = T.alloc_shared((C, H), "float32")
            acc = T.alloc_var("float32")
            for i, h in T.Parallel(C, H):
                tile[i, h] = T.if_then_else(start + i < end, g[start + i, h], 0.0)
            for hb in T.serial(T.ceildiv(H, threads)):
                h = hb * threads + tx
                if h < H:
                    acc = 0.0
                    for i in T.serial(C):
                        row = (C - 1 - i) if reverse else i
                        acc = acc + tile[row, h]
                        tile[row, h] = acc
            for i, h in T.Parallel(C, H):
                if start + i < end:
                    out[start + i, h] = tile[i, h]

    return compile_for(chunk_local_cumsum, arch)


def chunk_local_cumsum(g, table, C: int, arch: str, reverse: bool = False, out=None):
    """g: `[n_tok, H]` fp32 (flattened tokens) -> in-chunk cumsum `[n_tok, H]` fp32.

    Tokens outside every chunk (the padding tail) are left as they are in ``out``; with ``out`` None
    they are zero (only the tail is cleared when the table knows where it starts: no full memset).
    """
    if out is None:
        end = getattr(table, "tokens_end", None)
        if end is None:
            out = torch.zeros_like(g)
        else:
            out = torch.empty_like(g)
            if end < g.shape[0]:
                out[end:].zero_()
    kernel = chunk_local_cumsum_kernel(g.shape[1], C, reverse, arch)
    kernel(g, table.chunk_bounds, out)
    return out
