"""The per-chunk loads and elementwise steps of bwd_h_pipelined that do not depend on how products
are issued (TileLang macros used by blackwell/bwd_h_pipelined.py inside its T.Pipelined chunk loop;
the formulas are in that file's header), and the block's
sequence / head / V-tile indices (``sequence_block``), which bwd_dh_pipelined.py shares. Parameter names
match the kernels' own names on purpose: TileLang names a buffer or variable passed to a macro after
the parameter, so equal names keep the generated CUDA of both kernels exactly as it was before these
steps moved here.
"""

import tilelang.language as T


@T.macro
def load_chunk(k, v, A, fac, h_out, K_s, V_s, A_s, F_s, S_f, S_s, Ab_s, c, t0, cbase, hk, h, v0,
               C: int, BV: int, dtype: str):
    """The chunk's K, V, A tiles and factors; the state S (bf16) into shared memory and out as this
    chunk's h; Ab = A .* beta_col."""
    T.copy(k[t0:t0 + C, hk, :], K_s)
    T.copy(v[t0:t0 + C, h, v0:v0 + BV], V_s)
    T.copy(A[t0:t0 + C, h, :], A_s)
    T.copy(fac[cbase + c, h, :, :], F_s)

    T.copy(S_f, S_s)
    T.copy(S_s, h_out[cbase + c, h, :, v0:v0 + BV])
    for i, j in T.Parallel(C, C):
        Ab_s[i, j] = T.cast(A_s[i, j] * F_s[2, j], dtype)


@T.macro
def form_y(KS_f, V_s, F_s, Y_s, t0, eos, C: int, BV: int, dtype: str):
    """Y = diag(r) V - e_last K S (K S in KS_f), zero past the sequence end."""
    for i, j in T.Parallel(C, BV):
        Y_s[i, j] = T.if_then_else(
            t0 + i < eos, T.cast(F_s[1, i] * V_s[i, j] - F_s[0, C - 1] * KS_f[i, j], dtype),
            T.cast(0, dtype))


@T.macro
def store_z_mask_k(Z_f, Z_s, K_s, t0, eos, C: int, K: int, BV: int, dtype: str):
    """Z = Ab Y (in Z_f) as bf16, zero past the sequence end; on a partial chunk K's rows past the
    end are zeroed as well (a read-modify-write select) before K^T Z."""
    for i, j in T.Parallel(C, BV):
        Z_s[i, j] = T.if_then_else(t0 + i < eos, T.cast(Z_f[i, j], dtype), T.cast(0, dtype))
    if t0 + C > eos:
        for i, d in T.Parallel(C, K):
            K_s[i, d] = T.if_then_else(t0 + i < eos, K_s[i, d], T.cast(0, dtype))


def reverse_run(bos, eos, C: int, chunk_skip, has_skip, n, h):
    """Chunks a reverse pass block runs: its sequence's, less the last ``chunk_skip[n, h]`` ones when
    ``has_skip`` != 0 (the pass then starts from its terminal gradient at the end of the chunk before
    them: backward_cp's truncated local pass). The row index is guarded too, so a [1, H_v] dummy with
    has_skip = 0 is never over-read."""
    skip_row = T.if_then_else(has_skip != 0, n, 0)
    skip = T.max(T.if_then_else(has_skip != 0, chunk_skip[skip_row, h], 0), 0)
    return T.max(T.ceildiv(eos - bos, C) - skip, 0)


@T.macro
def sequence_block(cu_seqlens, chunk_offsets, seq_order, bx, by, h_v: int, group: int, BV: int):
    """Sequence n, v-head h, its k-head hk, first V column v0, token range [bos, eos) and first chunk
    row cbase of the block (bx = V tile, by = row * H_v + h: the kernels' ``iv`` and ``nh``, passed
    under the names T.Kernel gives them; n = seq_order[row], the host's dispatch order: longest chains first
    on the plain path, `ChunkTable.seq_order`; token order for CP pieces, `CPPlan.piece_order`); used by
    bwd_h_ws, bwd_dh_ws and the pipelined bwd_h / bwd_dh alike."""
    n = seq_order[by // h_v]
    h = by % h_v
    hk = h // group
    v0 = bx * BV
    bos = cu_seqlens[n]
    eos = cu_seqlens[n + 1]
    cbase = chunk_offsets[n]
    return n, h, hk, v0, bos, eos, cbase
