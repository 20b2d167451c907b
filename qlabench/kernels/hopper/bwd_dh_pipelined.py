"""bwd_dh_pipelined: the reverse-over-chunks state-gradient pass with its per-chunk masks precomputed
(bwd_prepare) and its loads TMA-pipelined; one block per (sequence, v-head, V tile).

Formula per chunk, last chunk first (dS = gradient of the state at the chunk END, K x BV fp32 in
registers, starting from dht; Pg = scale Gam .* Q K^T and Ag = Gam .* A_k .* beta_col come from
bwd_prepare in bf16, e = exp(gam) and r = exp(gam_C - gam) from its per-chunk factor table):

    dh[c] = dS
    dV'   = diag(r) K dS + Pg^T dO           (gradient of v_new; stored for bwd_chunk)
    dU    = -diag(e) Ag^T dV'                (Ag^T dV' is the final dv, v enters only through W: bwd_chunk
                                              forms and stores it, over dV' in place)
    dS    = exp(gam_C) dS + K^T dU + Q^T (scale diag(e) dO)
    after the first chunk: dh0 = dS (always written; the host drops it without h0)

The masks and factors are formed once per chunk in bwd_prepare, so the serial loop holds no
exponential and no C x C mask.
Every term is per V column, so V tiling is exact.

Loads: Q, K, dO, Pg, Ag and the factor row of chunk c - 1 are fetched by TileLang's automatic
producer warpgroup (TMA, 2-stage ring) while chunk c computes. The tiles are unmasked
[t0, t0 + C); in the sequence's partial last chunk (the first one processed) the rows past the
sequence end are zeroed in shared memory before use and dV' is cut there by a select, so data of the
next sequence (or a non-finite padding tail) cannot leak in.
Grid: (V / BV, N * H_v). Threads: 256 consumer (two warpgroups, every step in order, each GEMM
split between them) + 128 producer.
GEMMs per chunk (wgmma, smem operands, fp32 accumulate): K dS 64xBVx128, Pg^T dO 64xBVx64,
Ag^T dV' 64xBVx64, K^T dU 128xBVx64, Q^T eDO 128xBVx64.
Shared memory (BV = 64, bf16): ring 2 x (Q, K 2 x 16 KB, dO 8 KB, Pg, Ag 2 x 8 KB, factors
0.75 KB) = ~114 KB; dS 16 KB, dV', dU, eDO 3 x 8 KB: ~154 KB.
BV = 32 (backward._value_tile picks it where that grid is predicted to finish first) is the same code:
each consumer warpgroup's wgmma has N = 16 (32 at BV = 64); the TMA tiles that are wgmma operands (dO loaded, dS
stored out as dh) are laid out in 16-column halves with 32-byte swizzle, in the TMA maps and in the
wgmma descriptors alike (32-column halves, 64-byte swizzle at BV = 64); as compiled (TileLang 0.1.15,
sm_90a) 133,120 B of shared memory (165,888 B at BV = 64) while it still stored dv, no local memory either way.
scale is a runtime argument (one compiled kernel serves every scale).
Emulated step for step by ``qlabench.kernels.emulate_bwd._emu_dh`` (twin ``twin_bwd_dh_pipelined``).
The loads and elementwise steps that do not depend on how products are issued are TileLang macros
in common/bwd_dh.py, shared with blackwell/bwd_dh_pipelined.py.
"""

import functools

import tilelang.language as T

from ..common.bwd_dh import du, load_chunk, store_dvp, store_state
from ..common.bwd_h import reverse_run, sequence_block
from .bwd_common import compile_bwd


@functools.cache
def bwd_dh_pipelined_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str, arch: str):
    group = h_v // h_qk
    NV = V // BV
    n_tok = T.dynamic("n_tok")
    n_cu = T.dynamic("n_cu")
    n_ord = T.dynamic("n_ord")
    n_seq = T.dynamic("n_seq")
    n_hc = T.dynamic("n_hc")
    n_fc = T.dynamic("n_fc")
    n_skip = T.dynamic("n_skip")

    @T.prim_func
    def bwd_dh_pipelined(
        q: T.Tensor((n_tok, h_qk, K), dtype),
        k: T.Tensor((n_tok, h_qk, K), dtype),
        do: T.Tensor((n_tok, h_v, V), dtype),
        Pg: T.Tensor((n_tok, h_v, C), dtype),
        Ag: T.Tensor((n_tok, h_v, C), dtype),
        fac: T.Tensor((n_fc, h_v, 3, C), "float32"),
        cu_seqlens: T.Tensor((n_cu,), "int32"),
        chunk_offsets: T.Tensor((n_cu,), "int32"),
        seq_order: T.Tensor((n_ord,), "int32"),
        chunk_skip: T.Tensor((n_skip, h_v), "int32"),
        dht: T.Tensor((n_seq, h_v, K, V), "float32"),
        dh_out: T.Tensor((n_hc, h_v, K, V), dtype),
        dvp_out: T.Tensor((n_tok, h_v, V), dtype),
        dh0_out: T.Tensor((n_seq, h_v, K, V), "float32"),
        scale: T.float32,
        has_skip: T.int32,
    ):
        with T.Kernel(NV, (n_cu - 1) * h_v, threads=256) as (iv, nh):
            Q_s = T.alloc_shared((C, K), dtype)
            K_s = T.alloc_shared((C, K), dtype)
            dO_s = T.alloc_shared((C, BV), dtype)
            Pg_s = T.alloc_shared((C, C), dtype)
            Ag_s = T.alloc_shared((C, C), dtype)
            F_s = T.alloc_shared((3, C), "float32")
            dS_s = T.alloc_shared((K, BV), dtype)
            dVp_s = T.alloc_shared((C, BV), dtype)
            dU_s = T.alloc_shared((C, BV), dtype)
            eDO_s = T.alloc_shared((C, BV), dtype)
            dS_f = T.alloc_fragment((K, BV), "float32")
            dVp_f = T.alloc_fragment((C, BV), "float32")
            dW_f = T.alloc_fragment((C, BV), "float32")

            n, h, hk, v0, bos, eos, cbase = sequence_block(cu_seqlens, chunk_offsets, seq_order, iv, nh, h_v, group, BV)
            n_chunks = reverse_run(bos, eos, C, chunk_skip, has_skip, n, h)

            T.copy(dht[n, h, :, v0:v0 + BV], dS_f)

            for cr in T.Pipelined(n_chunks, num_stages=2):
                c = n_chunks - 1 - cr
                t0 = bos + c * C
                # rows past the sequence end zeroed by read-modify-write selects (see load_chunk)
                load_chunk(q, k, do, Pg, Ag, fac, Q_s, K_s, dO_s, Pg_s, Ag_s, F_s, c, t0, eos, cbase, hk, h, v0,
                           C, K, BV, dtype)

                store_state(dS_f, dS_s, dh_out, eDO_s, F_s, dO_s, scale, c, cbase, h, v0, C, BV, dtype)

                T.gemm(K_s, dS_s, dVp_f, clear_accum=True)
                for i, j in T.Parallel(C, BV):
                    dVp_f[i, j] = dVp_f[i, j] * F_s[1, i]
                T.gemm(Pg_s, dO_s, dVp_f, transpose_A=True)
                for i, j in T.Parallel(C, BV):
                    dVp_s[i, j] = T.if_then_else(t0 + i < eos, T.cast(dVp_f[i, j], dtype), T.cast(0, dtype))

                T.gemm(Ag_s, dVp_s, dW_f, transpose_A=True, clear_accum=True)
                du(dW_f, F_s, dU_s, C, BV, dtype)
                store_dvp(dVp_s, dvp_out, t0, eos, h, v0, C, BV)

                for i, j in T.Parallel(K, BV):
                    dS_f[i, j] = dS_f[i, j] * F_s[0, C - 1]
                T.gemm(K_s, dU_s, dS_f, transpose_A=True)
                T.gemm(Q_s, eDO_s, dS_f, transpose_A=True)

            T.copy(dS_f, dh0_out[n, h, :, v0:v0 + BV])

    return compile_bwd(bwd_dh_pipelined, arch)
