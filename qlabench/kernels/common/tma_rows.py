"""A chunk's rows loaded as whole C-row TMA boxes: the rows past a partial chunk's end.

A TMA box of C rows starting at the chunk's first token reads past the chunk's end on a sequence's last,
partial chunk: those rows hold the next sequence's tokens or the padding tail (which may be non-finite;
rows past the tensor itself arrive as zeros). A product that reaches them, even multiplied by zero,
would carry a NaN into the chunk's own rows, so the kernels zero them in shared memory once the box has
landed and before any product reads the tile (hopper/kkt_solve.py, hopper/bwd_chunk.py).
"""

import tilelang.language as T


@T.macro
def zero_rows_past_end(Q_s, K_s, t0, end, C: int, K: int, dtype: str):
    """Rows t0 + i >= end of the C x K tiles Q_s (None: K_s alone) and K_s set to zero; nothing on a whole
    chunk (end - t0 >= C)."""
    if end - t0 < C:
        for i, d in T.Parallel(C, K):
            if t0 + i >= end:
                if Q_s is not None:
                    Q_s[i, d] = T.cast(0, dtype)
                K_s[i, d] = T.cast(0, dtype)
