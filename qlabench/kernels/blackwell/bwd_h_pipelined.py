"""bwd_h_pipelined for sm100 / sm103: recompute the per-chunk start states h for the backward, with the
three products per chunk as tcgen05 MMAs into tensor memory; one block per (sequence, v-head, V tile).
Same signature, inputs and outputs as hopper/bwd_h_ws.py (sm90's bwd_h, which forms K^T A_k diag(beta)
first in a warpgroup of its own; this file keeps the three-product chain below).

Formula per chunk (gate-free A_k; r = exp(gam_C - gam), exp(gam_C) and beta (zero past the sequence
end) come from bwd_prepare's per-chunk factor table F: F[0] = e (F[0, C-1] = exp(gam_C)), F[1] = r,
F[2] = beta; S is K x BV fp32 in registers):

    h[c] = S
    Y    = diag(r) V - exp(gam_C) (K S)        (C x BV)
    Z    = (A_k diag(beta)) Y
    S    = exp(gam_C) S + K^T Z

Products (bf16 operands in shared memory, fresh fp32 accumulators in tensor memory, completion on an
mbarrier each, waited on within the chunk):
    K S     C x BV x K  -> KS_t   (tcgen05.mma issued asynchronously, waited before Y)
    Ab Y    C x BV x C  -> Z_t    (asynchronous, waited before Z is cast)
    K^T Z   K x BV x C  -> KZ_t   (K_s read transposed; the synchronous form, see below)
S = exp(gam_C) S + K^T Z is formed in registers after the tcgen05.ld read-back (Hopper accumulated
into the register state directly, which tcgen05 cannot: its accumulator lives in tensor memory).
Loads: K, V, A and the factor row of chunk c + 1 come from TileLang's automatic producer warpgroup
(TMA, 2-stage ring). That producer refills a stage right after the statement that reads it last and
does not know a tcgen05 read is still in flight: K^T Z, the last reader of K_s, is therefore issued
with ``T.gemm(..., mbar=)`` on the tensor-memory accumulator (tcgen05 issue + wait in one statement).
Rows past the sequence end: selects on Y and Z; K's rows there are zeroed (read-modify-write select)
after K S has completed and before K^T Z.
Grid: (V / BV, N * H_v), BV = 64 (tcgen05's 64-row atoms need N >= 64 in TileLang 0.1.15: at BV = 32
its layout inference stops with "TCGEN05 meta not initialized"), so backward._value_tile keeps 64 on
sm100 where sm90 narrows to 32 for small grids.
Threads: 128 consumer (one warpgroup: elected-thread MMA issue, tensor-memory read-back by lanes)
+ 128 producer.
tcgen05 evidence (TileLang 0.1.15, nvcc 13.0, sm_100a, compiled on a CPU-only machine, never run on
hardware): the generated CUDA holds ``tl::tcgen05mma_ws_ss`` / ``tl::tcgen05mma_ss`` (tcgen05.mma),
``tl::tcgen05_mma_arrive`` (tcgen05.commit) and ``tl::tcgen05_ld_32dp32bNx`` (tcgen05.ld), no
mma.sync and no wgmma; SASS (cuobjdump -sass, hk1_hv2 bf16):
24 UTCHMMA.WS + 8 UTCHMMA, 3 LDTM, 15 UTMALDG, no HMMA; no local-memory spills.
Checked on every CI run by tests/kernels/test_aot_blackwell.py (source; SASS where cuobjdump is
installed). Shared memory per block as compiled: 108,544 B.
The loads and elementwise steps that do not depend on how products are issued are TileLang macros
in common/bwd_h.py.
"""

import functools

import tilelang.language as T

from ..common.bwd_h import form_y, load_chunk, sequence_block, store_z_mask_k
from ..hopper.bwd_common import compile_bwd


@functools.cache
def bwd_h_pipelined_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str, arch: str):
    if BV < 64 or C != 64 or K != 128:
        raise ValueError(f"the sm100 bwd_h is written for BV >= 64, C = 64, K = 128 (got BV={BV}, C={C}, K={K})")
    group = h_v // h_qk
    NV = V // BV
    n_tok = T.dynamic("n_tok")
    n_cu = T.dynamic("n_cu")
    n_ord = T.dynamic("n_ord")
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
        seq_order: T.Tensor((n_ord,), "int32"),
        h0: T.Tensor((n_seq, h_v, K, V), "float32"),
        h_out: T.Tensor((n_hc, h_v, K, V), dtype),
    ):
        with T.Kernel(NV, (n_cu - 1) * h_v, threads=128) as (iv, nh):
            K_s = T.alloc_shared((C, K), dtype)
            V_s = T.alloc_shared((C, BV), dtype)
            A_s = T.alloc_shared((C, C), dtype)
            F_s = T.alloc_shared((3, C), "float32")
            Ab_s = T.alloc_shared((C, C), dtype)
            S_s = T.alloc_shared((K, BV), dtype)
            Y_s = T.alloc_shared((C, BV), dtype)
            Z_s = T.alloc_shared((C, BV), dtype)
            KS_t = T.alloc_tmem((C, BV), "float32")
            Z_t = T.alloc_tmem((C, BV), "float32")
            KZ_t = T.alloc_tmem((K, BV), "float32")
            bar = T.alloc_barrier([1, 1, 1])  # K S, Ab Y, K^T Z complete
            S_f = T.alloc_fragment((K, BV), "float32")
            KZ_f = T.alloc_fragment((K, BV), "float32")
            KS_f = T.alloc_fragment((C, BV), "float32")
            Z_f = T.alloc_fragment((C, BV), "float32")

            n, h, hk, v0, bos, eos, cbase = sequence_block(cu_seqlens, chunk_offsets, seq_order, iv, nh, h_v, group, BV)

            T.copy(h0[n, h, :, v0:v0 + BV], S_f)

            for c in T.Pipelined(T.ceildiv(eos - bos, C), num_stages=2):
                t0 = bos + c * C
                ph = c % 2  # each barrier completes once per chunk
                load_chunk(k, v, A, fac, h_out, K_s, V_s, A_s, F_s, S_f, S_s, Ab_s, c, t0, cbase, hk, h, v0, C, BV, dtype)
                T.fence_proxy_async()
                T.sync_threads()
                T.tcgen05_gemm(K_s, S_s, KS_t, clear_accum=True, mbar=bar[0])
                T.mbarrier_wait_parity(bar[0], ph)
                T.tcgen05_after_thread_sync()
                T.copy(KS_t, KS_f)
                form_y(KS_f, V_s, F_s, Y_s, t0, eos, C, BV, dtype)
                T.fence_proxy_async()
                T.sync_threads()
                T.tcgen05_gemm(Ab_s, Y_s, Z_t, clear_accum=True, mbar=bar[1])
                T.mbarrier_wait_parity(bar[1], ph)
                T.tcgen05_after_thread_sync()
                T.copy(Z_t, Z_f)
                store_z_mask_k(Z_f, Z_s, K_s, t0, eos, C, K, BV, dtype)  # K S has completed (bar 0)
                T.fence_proxy_async()
                T.sync_threads()
                # last reader of K_s: issue + wait in one statement (see the header)
                T.gemm(K_s, Z_s, KZ_t, transpose_A=True, clear_accum=True, mbar=bar[2])
                T.mbarrier_wait_parity(bar[2], ph)
                T.tcgen05_after_thread_sync()
                T.copy(KZ_t, KZ_f)
                for i, j in T.Parallel(K, BV):
                    S_f[i, j] = S_f[i, j] * F_s[0, C - 1] + KZ_f[i, j]

    return compile_bwd(bwd_h_pipelined, arch)
