"""bwd_prepare for sm100 / sm103: the state-independent per-chunk pieces of the backward, with Q K^T as
a tcgen05 MMA into tensor memory; one block per (chunk, v-head). Same signature, inputs and outputs as
hopper/bwd_prepare.py.

Formula per chunk (gam = in-chunk cumsum of g clamped to the last real token, A = gate-free A_k,
Gam[i, j] = exp(gam_i - gam_j) for j <= i else 0):

    Pg  = scale Gam .* Q K^T            (C x C, bf16 out, rows t0 .. end - 1)
    Ag  = Gam .* A .* beta_col          (C x C, bf16 out, rows t0 .. end - 1)
    fac = [e; r; beta]                  (3 x C fp32 out per chunk row)

Q K^T (C x C x K, bf16 operands in shared memory) is issued with ``T.tcgen05_gemm`` into a C x C fp32
tensor-memory accumulator, completion on an mbarrier (parity 0: one use per block), read back with
tcgen05.ld. Rows past the chunk end are never stored; inside the stored rows the columns past the end
are cut by the causal select j <= i.
Grid: (NCmax chunks, H_v). Threads: 128 (one warpgroup). scale is a runtime argument.
tcgen05 evidence (TileLang 0.1.15, nvcc 13.0, sm_100a, compiled on a CPU-only machine, never run on
hardware): the generated CUDA holds ``tl::tcgen05mma_ws_ss`` (tcgen05.mma), ``tl::tcgen05_mma_arrive``
(tcgen05.commit) and ``tl::tcgen05_ld_32dp32bNx`` (tcgen05.ld), no mma.sync and no wgmma; SASS (cuobjdump -sass, hk1_hv2 bf16):
16 UTCHMMA.WS, 1 LDTM, no HMMA (the Hopper file for sm_100a: 32 HMMA.16816); no local-memory spills.
Checked on every CI run by tests/kernels/test_aot_blackwell.py (source; SASS where cuobjdump is
installed). Shared memory per block as compiled: 57,856 B.
The loads and elementwise steps that do not depend on how products are issued are TileLang macros
in common/bwd_prepare.py, shared with hopper/bwd_prepare.py.
"""

import functools

import tilelang.language as T

from ..common.bwd_prepare import load_chunk, store_masks
from ..common.smem_layout import swizzled
from ..hopper.bwd_common import compile_bwd


@functools.cache
def bwd_prepare_kernel(h_qk: int, h_v: int, K: int, C: int, dtype: str, arch: str):
    group = h_v // h_qk
    n_tok = T.dynamic("n_tok")
    n_chunks = T.dynamic("n_chunks")

    @T.prim_func
    def bwd_prepare(
        q: T.Tensor((n_tok, h_qk, K), dtype),
        k: T.Tensor((n_tok, h_qk, K), dtype),
        g_cumsum: T.Tensor((n_tok, h_v), "float32"),
        beta: T.Tensor((n_tok, h_v), "float32"),
        A: T.Tensor((n_tok, h_v, C), dtype),
        chunk_bounds: T.Tensor((n_chunks, 2), "int32"),
        Pg_out: T.Tensor((n_tok, h_v, C), dtype),
        Ag_out: T.Tensor((n_tok, h_v, C), dtype),
        fac_out: T.Tensor((n_chunks, h_v, 3, C), "float32"),
        scale: T.float32,
    ):
        with T.Kernel(n_chunks, h_v, threads=128) as (c, hv):
            Q_s = T.alloc_shared((C, K), dtype)
            K_s = T.alloc_shared((C, K), dtype)
            A_s = T.alloc_shared((C, C), dtype)
            Pg_s = T.alloc_shared((C, C), dtype)
            Ag_s = T.alloc_shared((C, C), dtype)
            gam_s = T.alloc_shared((C,), "float32")
            beta_s = T.alloc_shared((C,), "float32")
            P_t = T.alloc_tmem((C, C), "float32")
            done = T.alloc_barrier(1)
            P_f = T.alloc_fragment((C, C), "float32")
            Ag_f = T.alloc_fragment((C, C), "float32")
            T.annotate_layout(swizzled(A_s, Pg_s, Ag_s))  # read and written in the fragment layout

            t0 = chunk_bounds[c, 0]
            end = chunk_bounds[c, 1]
            hk = hv // group

            if t0 < end:
                load_chunk(q, k, A, g_cumsum, beta, Q_s, K_s, A_s, gam_s, beta_s, t0, end, hk, hv, C)

                T.fence_proxy_async()
                T.sync_threads()
                T.tcgen05_gemm(Q_s, K_s, P_t, transpose_B=True, clear_accum=True, mbar=done[0])
                T.mbarrier_wait_parity(done[0], 0)
                T.tcgen05_after_thread_sync()
                T.copy(P_t, P_f)
                store_masks(P_f, Ag_f, A_s, gam_s, beta_s, Pg_s, Ag_s, Pg_out, Ag_out, fac_out, scale, c, t0, end, hv, C, dtype)

    return compile_bwd(bwd_prepare, arch)
