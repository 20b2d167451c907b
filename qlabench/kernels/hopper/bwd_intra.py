"""bwd_intra: per-chunk C x C gradients (decay masks, WY inverse) and the final dq, dk, dbeta, dg.

Formula per chunk (inputs dAg, dPg, dq0, dk0, dgam0 from bwd_state; A = gate-free A_k;
Gam[i, j] = exp(gam_i - gam_j) for j <= i else 0):

    P   = Q K^T;  KK = K K^T
    dAb = Gam .* dAg;  dA = dAb .* beta_col;  dP = scale Gam .* dPg
    X   = (scale Gam .* P) .* dPg + dAb .* A .* beta_col          (kept fp32 in shared memory)
    dL  = -strict_lower(A^T dA A^T);  dM = diag(beta) dL;  dAs = dM + dM^T
    dq  = dq0 + dP K                                         (per v-head; host sums GQA groups)
    dk  = dk0 + dP^T Q + dAs K
    dbeta_t = colsum(dAb .* A)_t + rowsum(dL .* KK)_t
    dgam = dgam0 + rowdot(Q, dq0) + rowsum(X) - colsum(X)
    dg_t = sum_{s >= t in the chunk} dgam_s                  (the raw gate's gradient)

dq, dk accumulate in fp32 and are stored as ``out_dtype``: float32 (the default; with GQA the host
sums each group of v-heads, then casts) or the inputs' dtype (H_v == H_qk: dq, dk are then the final
gradients and the host has no fp32 buffer and no cast pass; one rounding either way).

The mask term rowsum(X) - colsum(X) is a cancellation under strong decay, so X goes through the
transpose in fp32 (never bf16). Column sums are formed as row sums of a transposed shared tile
(every reduction is along the last dimension).

Grid: (NCmax chunks, H_v); unused chunk-table rows (start == end) do nothing. Threads: 256.
GEMMs per chunk (wgmma, smem operands, fp32 accumulate): Q K^T, K K^T 64x64x128, A^T dA and
T1 A^T 64x64x64, dP K, dP^T Q, dAs K 64x128x64.
Shared memory: Q, K 2 x 16 KB bf16; A, dA, dP, T1, dAs 5 x 8 KB bf16; X, Y, dM 3 x 16 KB fp32;
vectors ~1.5 KB: ~122 KB.
scale is a runtime argument (one compiled kernel serves every scale).
Emulated step for step by ``qlabench.kernels.emulate_bwd._emu_intra``.
The loads and elementwise steps that do not depend on how products are issued are TileLang macros
in common/bwd_intra.py, shared with blackwell/bwd_intra.py.
"""

import functools

import tilelang.language as T

from ..common.bwd_intra import gated_masks, load_chunk, load_dq0, mask_sums, store_dg_dbeta, wy_inverse_grad
from .bwd_common import compile_bwd


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
        with T.Kernel(n_chunks, h_v, threads=256) as (c, hv):
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
            P_f = T.alloc_fragment((C, C), "float32")
            KK_f = T.alloc_fragment((C, C), "float32")
            T1_f = T.alloc_fragment((C, C), "float32")
            T2_f = T.alloc_fragment((C, C), "float32")
            tmp_f = T.alloc_fragment((C, C), "float32")
            dq_f = T.alloc_fragment((C, K), "float32")
            dk_f = T.alloc_fragment((C, K), "float32")
            prod_f = T.alloc_fragment((C, K), "float32")
            red_f = T.alloc_fragment((C,), "float32")

            t0 = chunk_bounds[c, 0]
            end = chunk_bounds[c, 1]
            hk = hv // group

            if t0 < end:
                load_chunk(q, k, A, g_cumsum, beta, dgam0, Q_s, K_s, A_s, gam_s, beta_s, dgam_s, t0, end, hk, hv,
                           C, K, dtype)

                T.gemm(Q_s, K_s, P_f, transpose_B=True, clear_accum=True)
                T.gemm(K_s, K_s, KK_f, transpose_B=True, clear_accum=True)
                gated_masks(P_f, dPg, dAg, A_s, gam_s, beta_s, X_s, Y_s, dA_s, dP_s, t0, end, hv, scale, C, dtype)

                # dgam mask term rowsum(X) - colsum(X) and dbeta colsum(Y), all fp32.
                mask_sums(X_s, Y_s, tmp_f, red_f, dgm_s, dbc_s, C)

                # WY inverse: dL = -strict_lower(A^T dA A^T)
                T.gemm(A_s, dA_s, T1_f, transpose_A=True, clear_accum=True)
                T.copy(T1_f, T1_s)
                T.gemm(T1_s, A_s, T2_f, transpose_B=True, clear_accum=True)
                wy_inverse_grad(T2_f, KK_f, beta_s, tmp_f, red_f, dM_s, dbr_s, dAs_s, C, dtype)

                # dq = dq0 + dP K, with rowdot(Q, dq0) for dgam
                load_dq0(dq0, Q_s, dq_f, prod_f, red_f, dgq_s, t0, end, hv, C, K)
                T.gemm(dP_s, K_s, dq_f)
                for i, j in T.Parallel(C, K):
                    if t0 + i < end:
                        dq_out[t0 + i, hv, j] = T.cast(dq_f[i, j], out_dtype)

                # dk = dk0 + dP^T Q + dAs K
                for i, j in T.Parallel(C, K):
                    dk_f[i, j] = T.if_then_else(t0 + i < end, dk0[t0 + i, hv, j], 0.0)
                T.gemm(dP_s, Q_s, dk_f, transpose_A=True)
                T.gemm(dAs_s, K_s, dk_f)
                for i, j in T.Parallel(C, K):
                    if t0 + i < end:
                        dk_out[t0 + i, hv, j] = T.cast(dk_f[i, j], out_dtype)

                # dg = reverse in-chunk cumsum of dgam; dbeta
                store_dg_dbeta(dgam_s, dgq_s, dgm_s, dbc_s, dbr_s, tmp_f, red_f, dg_out, dbeta_out, t0, end, hv, C)

    return compile_bwd(bwd_intra, arch)
