"""In-chunk cumulative sum of the log-gate (fp32), forward or reverse.

Formula: gam[t] = sum_{s in chunk(t), s <= t} g[s]   (reverse: sum over s >= t).
Grid: one block per chunk (chunk table bound NCmax; rows past the real chunk count exit), all H
heads of the chunk in that block. Threads: one per head (heads looped in steps of the block size);
each walks the <= C tokens of its chunk serially in fp32; reads across threads are coalesced over
heads. Shared memory: none.
"""


import functools

import tilelang.language as T
import torch

from .build import compile_for


@functools.cache
def chunk_local_cumsum_kernel(H: int, C: int, reverse: bool, arch: str):
    threads = 128 if H > 64 else (64 if H > 32 else 32)
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
            acc = T.alloc_var("float32")
            for hb in T.serial(T.ceildiv(H, threads)):
                h = hb * threads + tx
                if h < H:
                    acc = 0.0
                    for i in T.serial(C):
                        t = (end - 1 - i) if reverse else (start + i)
                        if start + i < end:
                            acc = acc + g[t, h]
                            out[t, h] = acc

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
