"""bwd_intra for sm100 / sm103: the per-chunk C x C gradients and the final dq, dk, dbeta, dg, with the
seven products per chunk as tcgen05 MMAs into tensor memory. Its math is the second half of
hopper/bwd_chunk.py (see its header), step for step ``emulate_bwd._emu_intra``; dq, dk per v-head in
``out_dtype`` (float32, summed over GQA groups on the host, or the inputs' dtype; fp32 accumulation
either way).

Formula per chunk (inputs dAg, dPg, dq0, dk0, dgam0 from bwd_state; A = gate-free A_k;
Gam[i, j] = exp(gam_i - gam_j) for j <= i else 0):

    P   = Q K^T;  KK = K K^T
    dAb = Gam .* dAg;  dA = dAb .* beta_col;  dP = scale Gam .* dPg
    X   = (scale Gam .* P) .* dPg + dAb .* A .* beta_col          (kept fp32 in shared memory)
    dL  = -strict_lower(A^T dA A^T);  dM = diag(beta) dL;  dAs = dM + dM^T
    dq  = dq0 + dP K
    dk  = dk0 + dP^T Q + dAs K
    dbeta_t = colsum(dAb .* A)_t + rowsum(dL .* KK)_t
    dgam = dgam0 + rowdot(Q, dq0) + rowsum(X) - colsum(X)
    dg_t = sum_{s >= t in the chunk} dgam_s

Products (bf16 operands in shared memory, fp32 accumulators in tensor memory, one mbarrier each; one
use per block, so every wait is for parity 0):
    Q K^T, K K^T   C x C x K   -> P_t, KK_t   (issued together)
    A^T dA         C x C x C   -> T1_t        (A_s read transposed)
    T1 A^T         C x C x C   -> T2_t
    dP K           C x K x C   -> dq_t        (dq0 added in registers after the read-back)
    dP^T Q, dAs K  C x K x C   -> dk_t        (the second accumulates onto the first in tensor memory;
                                              dk0 added in registers)
Reductions (row sums) run on register tiles as on Hopper.
Grid: (NCmax chunks, H_v). Threads: 128 (one warpgroup: elected-thread MMA issue, tensor-memory
read-back by lanes). Tensor memory: 4 x 32 + 2 x 64 = 256 of 512 columns.
scale is a runtime argument.
tcgen05 evidence (TileLang 0.1.15, nvcc 13.0, sm_100a, compiled on a CPU-only machine, never run on
hardware): the generated CUDA holds ``tl::tcgen05mma_ws_ss`` (tcgen05.mma) for all seven products,
``tl::tcgen05_mma_arrive`` (tcgen05.commit) and ``tl::tcgen05_ld_32dp32bNx`` (tcgen05.ld), no
mma.sync and no wgmma; SASS (cuobjdump -sass, hk1_hv2 bf16):
72 UTCHMMA.WS, 6 LDTM, no HMMA (the Hopper file for sm_100a: 192 HMMA.16816); no local-memory spills.
Checked on every CI run by tests/kernels/test_aot_blackwell.py (source; SASS where cuobjdump is
installed). Shared memory per block as compiled: 91,136 B.
The loads and elementwise steps that do not depend on how products are issued are TileLang macros
in common/bwd_intra.py, shared with hopper/bwd_chunk.py.
"""

import functools

import tilelang.language as T

from ..common.bwd_intra import gated_masks, load_chunk, load_dq0, mask_sums, store_dg_dbeta, wy_inverse_grad
from ..hopper.bwd_common import compile_bwd


@functools.cache
def bwd_intra_kernel(h_qk: int, h_v: int, K: int, C: int, dtype: str, arch: str, out_dtype: str = "float32"):
    if out_dtype not in ("float32", dtype):
        raise ValueError(f"dq, dk are stored as float32 or as {dtype} (the inputs' dtype), got {out_dtype!r}")
    group = h_v // h_qk
    n_tok = T.dynamic("n_tok")
    n_chunks = T.dynamic("n_chunks")

    @T.prim_func
    def bwd_intra(
        q: T.Tensor((n_tok, h_qk, K), dtype),
        k: T.Tensor((n_tok, h_qk, K), dtype),
        g_cumsum: T.Tensor((n_tok, h_v), "float32"),
        beta: T.Tensor((n_tok, h_v), "float32"),
        A: T.Tensor((n_tok, h_v, C), dtype),
        dAg: T.Tensor((n_tok, h_v, C), "float32"),
        dPg: T.Tensor((n_tok, h_v, C), "float32"),
        dq0: T.Tensor((n_tok, h_v, K), "float32"),
        dk0: T.Tensor((n_tok, h_v, K), "float32"),
        dgam0: T.Tensor((n_tok, h_v), "float32"),
        chunk_bounds: T.Tensor((n_chunks, 2), "int32"),
        dq_out: T.Tensor((n_tok, h_v, K), out_dtype),
        dk_out: T.Tensor((n_tok, h_v, K), out_dtype),
        dbeta_out: T.Tensor((n_tok, h_v), "float32"),
        dg_out: T.Tensor((n_tok, h_v), "float32"),
        scale: T.float32,
    ):
        with T.Kernel(n_chunks, h_v, threads=128) as (c, hv):
            Q_s = T.alloc_shared((C, K), dtype)
            K_s = T.alloc_shared((C, K), dtype)
            A_s = T.alloc_shared((C, C), dtype)
            dA_s = T.alloc_shared((C, C), dtype)
            dP_s = T.alloc_shared((C, C), dtype)
            T1_s = T.alloc_shared((C, C), dtype)
            dAs_s = T.alloc_shared((C, C), dtype)
            X_s = T.alloc_shared((C, C), "float32")
            Y_s = T.alloc_shared((C, C), "float32")
            dM_s = T.alloc_shared((C, C), "float32")
            gam_s = T.alloc_shared((C,), "float32")
            beta_s = T.alloc_shared((C,), "float32")
            dgam_s = T.alloc_shared((C,), "float32")
            dgq_s = T.alloc_shared((C,), "float32")
            dgm_s = T.alloc_shared((C,), "float32")
            dbc_s = T.alloc_shared((C,), "float32")
            dbr_s = T.alloc_shared((C,), "float32")
            P_t = T.alloc_tmem((C, C), "float32")
            KK_t = T.alloc_tmem((C, C), "float32")
            T1_t = T.alloc_tmem((C, C), "float32")
            T2_t = T.alloc_tmem((C, C), "float32")
            dq_t = T.alloc_tmem((C, K), "float32")
            dk_t = T.alloc_tmem((C, K), "float32")
            bar = T.alloc_barrier([1, 1, 1, 1, 1, 1])  # P, KK, T1, T2, dq, dk products complete
            P_f = T.alloc_fragment((C, C), "float32")
            KK_f = T.alloc_fragment((C, C), "float32")
            T1_f = T.alloc_fragment((C, C), "float32")
            T2_f = T.alloc_fragment((C, C), "float32")
            tmp_f = T.alloc_fragment((C, C), "float32")
            dq_f = T.alloc_fragment((C, K), "float32")
            dk_f = T.alloc_fragment((C, K), "float32")
            prod_f = T.alloc_fragment((C, K), "float32")
            mm_f = T.alloc_fragment((C, K), "float32")
            red_f = T.alloc_fragment((C,), "float32")

            t0 = chunk_bounds[c, 0]
            end = chunk_bounds[c, 1]
            hk = hv // group

            if t0 < end:
                load_chunk(q, k, A, g_cumsum, beta, dgam0, Q_s, K_s, A_s, gam_s, beta_s, dgam_s, t0, end, hk, hv,
                           C, K, dtype)

                T.fence_proxy_async()  # thread-written operands -> tensor-core reads
                T.sync_threads()
                T.tcgen05_gemm(Q_s, K_s, P_t, transpose_B=True, clear_accum=True, mbar=bar[0])
                T.tcgen05_gemm(K_s, K_s, KK_t, transpose_B=True, clear_accum=True, mbar=bar[1])
                T.mbarrier_wait_parity(bar[0], 0)
                T.tcgen05_after_thread_sync()
                T.copy(P_t, P_f)
                gated_masks(P_f, dPg, dAg, A_s, gam_s, beta_s, X_s, Y_s, dA_s, dP_s, t0, end, hv, scale, C, dtype)

                # dgam mask term rowsum(X) - colsum(X) and dbeta colsum(Y), all fp32.
                mask_sums(X_s, Y_s, tmp_f, red_f, dgm_s, dbc_s, C)

                # WY inverse: dL = -strict_lower(A^T dA A^T)
                T.fence_proxy_async()
                T.sync_threads()
                T.tcgen05_gemm(A_s, dA_s, T1_t, transpose_A=True, clear_accum=True, mbar=bar[2])
                T.mbarrier_wait_parity(bar[2], 0)
                T.tcgen05_after_thread_sync()
                T.copy(T1_t, T1_f)
                T.copy(T1_f, T1_s)
                T.fence_proxy_async()
                T.sync_threads()
                T.tcgen05_gemm(T1_s, A_s, T2_t, transpose_B=True, clear_accum=True, mbar=bar[3])
                T.mbarrier_wait_parity(bar[1], 0)
                T.mbarrier_wait_parity(bar[3], 0)
                T.tcgen05_after_thread_sync()
                T.copy(KK_t, KK_f)
                T.copy(T2_t, T2_f)
                wy_inverse_grad(T2_f, KK_f, beta_s, tmp_f, red_f, dM_s, dbr_s, dAs_s, C, dtype)

                # dq = dq0 + dP K, with rowdot(Q, dq0) for dgam
                load_dq0(dq0, Q_s, dq_f, prod_f, red_f, dgq_s, t0, end, hv, C, K)
                T.fence_proxy_async()  # dAs_s, dP_s written above
                T.sync_threads()
                T.tcgen05_gemm(dP_s, K_s, dq_t, clear_accum=True, mbar=bar[4])
                T.tcgen05_gemm(dP_s, Q_s, dk_t, transpose_A=True, clear_accum=True, mbar=None)  # bar[5] covers it
                T.tcgen05_gemm(dAs_s, K_s, dk_t, mbar=bar[5])  # accumulates onto dP^T Q
                T.mbarrier_wait_parity(bar[4], 0)
                T.tcgen05_after_thread_sync()
                T.copy(dq_t, mm_f)
                for i, j in T.Parallel(C, K):
                    dq_f[i, j] = dq_f[i, j] + mm_f[i, j]
                for i, j in T.Parallel(C, K):
                    if t0 + i < end:
                        dq_out[t0 + i, hv, j] = T.cast(dq_f[i, j], out_dtype)

                # dk = dk0 + dP^T Q + dAs K
                for i, j in T.Parallel(C, K):
                    dk_f[i, j] = T.if_then_else(t0 + i < end, dk0[t0 + i, hv, j], 0.0)
                T.mbarrier_wait_parity(bar[5], 0)
                T.tcgen05_after_thread_sync()
                T.copy(dk_t, mm_f)
                for i, j in T.Parallel(C, K):
                    dk_f[i, j] = dk_f[i, j] + mm_f[i, j]
                for i, j in T.Parallel(C, K):
                    if t0 + i < end:
                        dk_out[t0 + i, hv, j] = T.cast(dk_f[i, j], out_dtype)

                # dg = reverse in-chunk cumsum of dgam; dbeta
                store_dg_dbeta(dgam_s, dgq_s, dgm_s, dbc_s, dbr_s, tmp_f, red_f, dg_out, dbeta_out, t0, end, hv, C)

    return compile_bwd(bwd_intra, arch)
