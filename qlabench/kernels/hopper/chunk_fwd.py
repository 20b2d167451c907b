"""chunk_fwd: the chunk recurrence of the forward, one block per (sequence, v-head, V tile).

Formula per chunk (gam = in-chunk cumsum of g, e = exp(gam), r = exp(gam_C - gam),
Gam[i, j] = exp(gam_i - gam_j) for j <= i else 0; S is K x BV, fp32):

    U  = K S                      W  = V - diag(e) U
    Vd = Ag W                     (Ag = Gam .* A_k .* beta_col, from kkt_solve)
    O  = scale diag(e) Q S + Pm Vd                (Pm = scale Gam .* Q K^T, from kkt_solve)
    S  = exp(gam_C) S + K^T diag(r) Vd

The state-independent masks Ag and Pm come precomputed (kkt_solve runs all chunks in parallel), so
the serial loop holds only the four GEMMs that touch the state and the output. V tiling is exact:
every V column has its own recurrence. gam is clamped to the sequence's last real token, so a
partial chunk leaves the state as the reference does.

Two variants of one loop (``pipelined``). Both load whole tiles [t0, t0 + C) without row masks (TMA
or 16-byte vector loads; rows past n_tok read as zero); rows past the sequence end (the next
sequence, or the padding tail) are kept out of the result by selects, never by multiplying with zero
(so non-finite data there cannot leak in), and by zeroing K's padded rows before the state update.
  * pipelined (``chunk_fwd_pipelined``, the default on archs without chunk_fwd_ws, i.e. sm100 / sm120; sm90 runs hopper/chunk_fwd_ws.py): Q, K, V, Ag, Pm of chunk c + 1
    are loaded by TileLang's automatic producer warpgroup (TMA, 2-stage ring) while chunk c computes;
    one block per SM by its shared memory. ~1.9 us per chunk at BV = 32 on the H200.
  * plain: no producer warpgroup, loads exposed every chunk, 74 KB of shared memory; at 140
    registers per thread it holds one block per SM all the same (ncu: 12.5% occupancy). Slower on
    every grid measured (results/h200/NOTES.md: 1x32768 hk16_hv64, 512 blocks: whole forward 5.09 ms
    vs 3.60 ms pipelined); kept as the A/B baseline (QLABENCH_FWD_KERNEL=simple).
Grid: (V / BV, N * H_v); grid row r = nh // H_v runs sequence seq_order[r] (the host's dispatch order, longest chain
first: with one block per SM the long chains start first and the short ones fill in behind them). Threads: 256 (two warpgroups doing every step in order, splitting each GEMM
along N and the elementwise work) + TileLang's producer warps in the pipelined variant (512 threads per
block as launched; ncu at 1x32768 hk16_hv16: 106 registers, 128 KB dynamic shared memory, 25% occupancy).
GEMMs per chunk (wgmma, smem operands, fp32 accumulate): K S 64xBVx128, Ag W 64xBVx64,
Q S 64xBVx128, Pm Vd 64xBVx64, K^T Vr 128xBVx64.
Registers: S (K x BV fp32) stays in registers across chunks.
Shared memory (BV = 64): Q, K 2 x 16 KB, V 8 KB, Ag, Pm 2 x 8 KB, S 16 KB, W, Vd, Vr 3 x 8 KB,
gam 0.25 KB: ~104 KB (the pipelined variant doubles the Q, K, V, Ag, Pm buffers).
Extras: optional per-chunk start states h (bf16), final state (fp32); the block of the last
sequence zero-fills o on the padding tail after cu_seqlens[-1].
Chunk skip (``has_skip`` != 0, for the CP warm-up of forward_cp.py): block (sequence n, head h) starts
at chunk s = chunk_skip[n, h] (clamped at 0) of its sequence instead of chunk 0, i.e. it runs chunks
s .. ceil((eos - bos) / C) - 1 (none when s is at or past the chunk count) from the start state
h0 (or zero); o rows and h rows of the skipped chunks are not written, h rows keep their meaning
(row chunk_offsets[n] + chunk index in the sequence), the padding-tail zero-fill is unchanged. With
has_skip == 0 chunk_skip is never read (a [1, H_v] dummy does) and every chunk runs.
The loads and elementwise steps that do not depend on how products are issued are TileLang macros
in common/chunk_fwd.py, shared with blackwell/chunk_fwd.py.
"""

import functools

import tilelang.language as T

from ..common.build import compile_for
from ..common.chunk_fwd import form_vd_vr, form_w, load_chunk, load_state


@functools.cache
def chunk_fwd_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str, state_v_first: bool,
                     arch: str, pipelined: bool = False):
    """Compiled forward for one head configuration; scale and the h0 / final-state / h / chunk-skip
    switches are runtime arguments so that one binary serves every call of the configuration.

    Kernel arguments: (q, k, v, g_cumsum, Ag, Pm, cu_seqlens, chunk_offsets, seq_order, chunk_skip, h0, o, ht,
    h_out, scale, has_h0, store_final, store_h, has_skip); seq_order `[>= N]` int32: grid row r < N runs
    sequence seq_order[r] (the dispatch order: longest first on the plain path, `ChunkTable.seq_order`); chunk_skip
    `[n_skip, H_v]` int32 (any n_skip >= 1 when has_skip == 0, else one row per sequence of cu_seqlens); has_h0:
    0 (zero start), 1 (h0), 2 (the transition mode of the CP transition pass: identity start, V read as zero, h0 not read;
    every recurrence kernel has it)."""
    name = "chunk_fwd_pipelined" if pipelined else "chunk_fwd"

    group = h_v // h_qk
    THREADS = 256  # two warpgroups share every GEMM (N split) and the elementwise work
    NV = V // BV
    n_tok = T.dynamic("n_tok")
    n_cu = T.dynamic("n_cu")
    n_h0 = T.dynamic("n_h0")
    n_ht = T.dynamic("n_ht")
    n_hc = T.dynamic("n_hc")
    n_skip = T.dynamic("n_skip")
    n_ord = T.dynamic("n_ord")
    state_shape = (h_v, V, K) if state_v_first else (h_v, K, V)

    def chunk_fwd(
        q: T.Tensor((n_tok, h_qk, K), dtype),
        k: T.Tensor((n_tok, h_qk, K), dtype),
        v: T.Tensor((n_tok, h_v, V), dtype),
        g_cumsum: T.Tensor((n_tok, h_v), "float32"),
        Ag: T.Tensor((n_tok, h_v, C), dtype),
        Pm: T.Tensor((n_tok, h_v, C), dtype),
        cu_seqlens: T.Tensor((n_cu,), "int32"),
        chunk_offsets: T.Tensor((n_cu,), "int32"),
        seq_order: T.Tensor((n_ord,), "int32"),
        chunk_skip: T.Tensor((n_skip, h_v), "int32"),
        h0: T.Tensor((n_h0,) + state_shape, "float32"),
        o: T.Tensor((n_tok, h_v, V), dtype),
        ht: T.Tensor((n_ht,) + state_shape, "float32"),
        h_out: T.Tensor((n_hc,) + state_shape, dtype),
        scale: T.float32,
        has_h0: T.int32,
        store_final: T.int32,
        store_h: T.int32,
        has_skip: T.int32,
    ):
        with T.Kernel(NV, (n_cu - 1) * h_v, threads=THREADS) as (iv, nh):
            Q_s = T.alloc_shared((C, K), dtype)
            K_s = T.alloc_shared((C, K), dtype)
            V_s = T.alloc_shared((C, BV), dtype)
            S_s = T.alloc_shared((K, BV), dtype)
            W_s = T.alloc_shared((C, BV), dtype)
            Vd_s = T.alloc_shared((C, BV), dtype)
            Vr_s = T.alloc_shared((C, BV), dtype)
            P_s = T.alloc_shared((C, C), dtype)
            Ag_s = T.alloc_shared((C, C), dtype)
            gam_s = T.alloc_shared((C,), "float32")
            S_f = T.alloc_fragment((K, BV), "float32")
            U_f = T.alloc_fragment((C, BV), "float32")
            O_f = T.alloc_fragment((C, BV), "float32")
            gam_last = T.alloc_var("float32")

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

            load_state(S_f, h0, has_h0, n, h, v0, K, BV, state_v_first)

            for c in (T.Pipelined(n_run, num_stages=2) if pipelined else T.serial(n_run)):
                t0 = bos + (skip + c) * C
                load_chunk(q, k, v, Ag, Pm, g_cumsum, Q_s, K_s, V_s, Ag_s, P_s, gam_s, t0, eos, h, hk, v0, C, BV)
                T.copy(S_f, S_s)
                if store_h != 0:
                    for i, j in T.Parallel(K, BV):
                        if state_v_first:
                            h_out[chunk_offsets[n] + skip + c, h, v0 + j, i] = S_s[i, j]
                        else:
                            h_out[chunk_offsets[n] + skip + c, h, i, v0 + j] = S_s[i, j]
                gam_last = gam_s[C - 1]

                T.gemm(K_s, S_s, U_f, clear_accum=True)
                form_w(V_s, U_f, gam_s, W_s, has_h0, t0, eos, C, BV, dtype)

                T.gemm(Ag_s, W_s, U_f, clear_accum=True)  # U_f now holds Vd
                form_vd_vr(U_f, gam_s, gam_last, Vd_s, Vr_s, K_s, t0, eos, C, K, BV, dtype)

                T.gemm(Q_s, S_s, O_f, clear_accum=True)
                for i, j in T.Parallel(C, BV):
                    O_f[i, j] = O_f[i, j] * (scale * T.exp(gam_s[i]))
                T.gemm(P_s, Vd_s, O_f)
                for i, j in T.Parallel(C, BV):
                    if t0 + i < eos:
                        o[t0 + i, h, v0 + j] = T.cast(O_f[i, j], dtype)

                for i, j in T.Parallel(K, BV):
                    S_f[i, j] = S_f[i, j] * T.exp(gam_last)
                T.gemm(K_s, Vr_s, S_f, transpose_A=True)

            if store_final != 0:
                for i, j in T.Parallel(K, BV):
                    if state_v_first:
                        ht[n, h, v0 + j, i] = S_f[i, j]
                    else:
                        ht[n, h, i, v0 + j] = S_f[i, j]

            if n == n_cu - 2:
                for c in T.serial(T.ceildiv(n_tok - eos, C)):
                    for i, j in T.Parallel(C, BV):
                        if eos + c * C + i < n_tok:
                            o[eos + c * C + i, h, v0 + j] = T.cast(0, dtype)

    chunk_fwd.__name__ = chunk_fwd.__qualname__ = name  # the kernel's name in profiles
    return compile_for(T.prim_func(chunk_fwd), arch)


@functools.cache
def chunk_fwd_pipelined_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str,
                               state_v_first: bool, arch: str):
    """The pipelined variant of ``chunk_fwd_kernel`` (its own kernel role in dispatch)."""
    return chunk_fwd_kernel(h_qk, h_v, K, V, BV, C, dtype, state_v_first, arch, True)
