"""bwd_h_pipelined: recompute the per-chunk start states h for the backward with TMA-pipelined loads,
one block per (sequence, v-head, V tile).

Formula per chunk (gate-free A_k; r = exp(gam_C - gam), exp(gam_C) and beta (zero past the sequence
end) come from bwd_prepare's per-chunk factor table; S is K x BV fp32 in registers):

    h[c] = S
    Y    = diag(r) V - exp(gam_C) K S          (C x BV)
    S    = exp(gam_C) S + K^T (A_k diag(beta)) Y

The factors are fp32 expressions formed once per chunk in bwd_prepare, so the serial loop holds no
exponential. V tiling is exact.

Loads: K, V, A and the factor row of chunk c + 1 are fetched by TileLang's automatic producer
warpgroup (TMA, 2-stage ring) while chunk c computes. The tiles are unmasked [t0, t0 + C); rows
past the sequence end are cut by selects on Y and Z, and K's rows there are zeroed (read-modify-write
select, after the load has landed) before the state update, so data of the next sequence or a
non-finite padding tail cannot leak in.
Grid: (V / BV, N * H_v). Threads: 256 consumer (two warpgroups, each GEMM split between them) +
128 producer.
GEMMs per chunk (wgmma, smem operands, fp32 accumulate): K S 64xBVx128, Ab Y 64xBVx64, K^T Z 128xBVx64.
Shared memory (BV = 64, bf16): ring 2 x (K 16 KB, V 8 KB, A 8 KB, factors 0.75 KB) = ~66 KB;
S 16 KB, Ab, Y, Z 3 x 8 KB: ~106 KB.
BV = 32 (backward._value_tile picks it on grids under half the SMs) is the same code: each consumer
warpgroup's wgmma has N = 16 (32 at BV = 64); the state tile S (a wgmma operand, stored out as h by
TMA) is laid out in 16-column halves with 32-byte swizzle, in the TMA map and in the wgmma
descriptors alike (32-column halves, 64-byte swizzle at BV = 64); as compiled (TileLang 0.1.15,
sm_90a) 83,968 B of shared memory (108,544 B at BV = 64), no local memory either way.
Emulated step for step by ``qlabench.kernels.emulate_bwd._emu_h`` (twin ``twin_bwd_h_pipelined``).
The loads and elementwise steps that do not depend on how products are issued are TileLang macros
in common/bwd_h.py, shared with blackwell/bwd_h_pipelined.py.
"""

import functools

import tilelang.language as T

from ..common.bwd_h import form_y, load_chunk, sequence_block, store_z_mask_k
from .bwd_common import compile_bwd


@functools.cache
def bwd_h_pipelined_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str, arch: str):
    group = h_v // h_qk
    NV = V // BV
    n_tok = T.dynamic("n_tok")
    n_cu = T.dynamic("n_cu")
    n_seq = T.dynamic("n_seq")
    n_hc = T.dynamic("n_hc")
    n_fc = T.dynamic("n_fc")

    @T.prim_func
    def bwd_h_pipelined(
        k: T.Tensor((n_tok, h_qk, K), dtype),
        v: T.Tensor((n_tok, h_v, V), dtype),
        A: T.Tensor((n_tok, h_v, C), dtype),
        fac: T.Tensor((n_fc, h_v, 3, C), "float32"),
        cu_seqlens: T.Tensor((n_cu,), "int32"),
        chunk_offsets: T.Tensor((n_cu,), "int32"),
        h0: T.Tensor((n_seq, h_v, K, V), "float32"),
        h_out: T.Tensor((n_hc, h_v, K, V), dtype),
    ):
        with T.Kernel(NV, (n_cu - 1) * h_v, threads=256) as (iv, nh):
            K_s = T.alloc_shared((C, K), dtype)
            V_s = T.alloc_shared((C, BV), dtype)
            A_s = T.alloc_shared((C, C), dtype)
            F_s = T.alloc_shared((3, C), "float32")
            Ab_s = T.alloc_shared((C, C), dtype)
            S_s = T.alloc_shared((K, BV), dtype)
            Y_s = T.alloc_shared((C, BV), dtype)
            Z_s = T.alloc_shared((C, BV), dtype)
            S_f = T.alloc_fragment((K, BV), "float32")
            KS_f = T.alloc_fragment((C, BV), "float32")
            Z_f = T.alloc_fragment((C, BV), "float32")

            n, h, hk, v0, bos, eos, cbase = sequence_block(cu_seqlens, chunk_offsets, iv, nh, h_v, group, BV)

            T.copy(h0[n, h, :, v0:v0 + BV], S_f)

            for c in T.Pipelined(T.ceildiv(eos - bos, C), num_stages=2):
                t0 = bos + c * C
                load_chunk(k, v, A, fac, h_out, K_s, V_s, A_s, F_s, S_f, S_s, Ab_s, c, t0, cbase, hk, h, v0, C, BV, dtype)

                T.gemm(K_s, S_s, KS_f, clear_accum=True)
                form_y(KS_f, V_s, F_s, Y_s, t0, eos, C, BV, dtype)
                T.gemm(Ab_s, Y_s, Z_f, clear_accum=True)
                store_z_mask_k(Z_f, Z_s, K_s, t0, eos, C, K, BV, dtype)

                for i, j in T.Parallel(K, BV):
                    S_f[i, j] = S_f[i, j] * F_s[0, C - 1]
                T.gemm(K_s, Z_s, S_f, transpose_A=True)

    return compile_bwd(bwd_h_pipelined, arch)
