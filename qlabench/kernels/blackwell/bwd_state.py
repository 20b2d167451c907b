"""bwd_state for sm100 / sm103: per-chunk gradients that need the states and the full V reduction, with
the seven products per chunk as tcgen05 MMAs into tensor memory; one block per (chunk, v-head). Its
math is the first half of hopper/bwd_chunk.py (which fuses it with bwd_intra; see its header), step
for step ``emulate_bwd._emu_state``; it writes dAg, dPg, dq0, dk0 and dgam0 for bwd_intra.

Formula per chunk (S0 = h[c], dS = dh[c], dV' and dv from bwd_dh, Ag = Gam .* A .* beta_col,
e = exp(gam), r = exp(gam_C - gam)):

    U   = K S0;   dU = -diag(e) dv;   W = V - diag(e) U;   V' = Ag W
    dAg = dV' W^T                      (C x C fp32, out)
    dPg = dO V'^T                      (C x C fp32, out)
    dq0 = scale diag(e) dO S0^T        (C x K fp32, out)
    T1  = V' dS^T;  dk0 = diag(r) T1 + dU S0^T          (C x K fp32, out)
    dgam0_i = rowdot(dU, U)_i - r_i rowdot(K, T1)_i, plus the gam_C terms on the last real row

Products (bf16 operands in shared memory, fresh fp32 accumulators in tensor memory, one mbarrier
each, one use per block: every wait is for parity 0), issued in three batches as soon as their
operands exist, so the tensor core works while the threads read back earlier results:
    batch 1: K S0 -> U_t (C x V x K),  dO S0^T -> dq_t (C x K x V)
    batch 2 (after W, dU are written): Ag W -> Vp_t,  dV' W^T -> dAg_t (C x C x V),  dU S0^T -> dUS_t
    batch 3 (after V' is written): dO V'^T -> dPg_t (C x C x V),  V' dS^T -> T1_t (C x K x V)
dk0 = r .* T1 + dU S0^T is formed in registers (Hopper scaled its register accumulator between two
accumulating GEMMs; a tensor-memory accumulator cannot be scaled in place).
Grid: (NCmax chunks, H_v). Threads: 128 (one warpgroup). Tensor memory: 5 x 64 + 2 x 32 = 384 of 512
columns. scale is a runtime argument.
tcgen05 evidence (TileLang 0.1.15, nvcc 13.0, sm_100a, compiled on a CPU-only machine, never run on
hardware): the generated CUDA holds ``tl::tcgen05mma_ws_ss`` (tcgen05.mma) for all seven products,
``tl::tcgen05_mma_arrive`` (tcgen05.commit) and ``tl::tcgen05_ld_32dp32bNx`` (tcgen05.ld), no
mma.sync and no wgmma; SASS (cuobjdump -sass, hk1_hv2 bf16):
104 UTCHMMA.WS, 7 LDTM, no HMMA (the Hopper file for sm_100a: 352 HMMA.16816); no local-memory spills.
Checked on every CI run by tests/kernels/test_aot_blackwell.py (source; SASS where cuobjdump is
installed). Shared memory per block as compiled: 164,864 B.
The loads and elementwise steps that do not depend on how products are issued are TileLang macros
in common/bwd_state.py, shared with hopper/bwd_chunk.py.
"""

import functools

import tilelang.language as T

from ..common.bwd_state import kt1_terms, load_chunk, store_dgam0, store_dq0, w_and_du
from ..hopper.bwd_common import compile_bwd


@functools.cache
def bwd_state_kernel(h_qk: int, h_v: int, K: int, V: int, C: int, dtype: str, arch: str):
    assert K == V, "the row-dot scratch prod_f serves both C x V and C x K products"
    group = h_v // h_qk
    n_tok = T.dynamic("n_tok")
    n_chunks = T.dynamic("n_chunks")
    n_hc = T.dynamic("n_hc")

    @T.prim_func
    def bwd_state(
        k: T.Tensor((n_tok, h_qk, K), dtype),
        v: T.Tensor((n_tok, h_v, V), dtype),
        do: T.Tensor((n_tok, h_v, V), dtype),
        dvp: T.Tensor((n_tok, h_v, V), dtype),
        dv: T.Tensor((n_tok, h_v, V), dtype),
        g_cumsum: T.Tensor((n_tok, h_v), "float32"),
        beta: T.Tensor((n_tok, h_v), "float32"),
        A: T.Tensor((n_tok, h_v, C), dtype),
        h: T.Tensor((n_hc, h_v, K, V), dtype),
        dh: T.Tensor((n_hc, h_v, K, V), dtype),
        chunk_bounds: T.Tensor((n_chunks, 2), "int32"),
        dAg_out: T.Tensor((n_tok, h_v, C), "float32"),
        dPg_out: T.Tensor((n_tok, h_v, C), "float32"),
        dq0_out: T.Tensor((n_tok, h_v, K), "float32"),
        dk0_out: T.Tensor((n_tok, h_v, K), "float32"),
        dgam0_out: T.Tensor((n_tok, h_v), "float32"),
        scale: T.float32,
    ):
        with T.Kernel(n_chunks, h_v, threads=128) as (c, hv):
            K_s = T.alloc_shared((C, K), dtype)
            V_s = T.alloc_shared((C, V), dtype)  # V, then W = V - diag(e) U
            dO_s = T.alloc_shared((C, V), dtype)
            dVp_s = T.alloc_shared((C, V), dtype)
            dv_s = T.alloc_shared((C, V), dtype)  # dv, then dU = -diag(e) dv
            Vp_s = T.alloc_shared((C, V), dtype)
            S0_s = T.alloc_shared((K, V), dtype)
            dS_s = T.alloc_shared((K, V), dtype)
            A_s = T.alloc_shared((C, C), dtype)
            Ag_s = T.alloc_shared((C, C), dtype)
            gam_s = T.alloc_shared((C,), "float32")
            beta_s = T.alloc_shared((C,), "float32")
            dgu_s = T.alloc_shared((C,), "float32")
            kt1_s = T.alloc_shared((C,), "float32")
            ss_s = T.alloc_shared((K,), "float32")
            U_t = T.alloc_tmem((C, V), "float32")
            dq_t = T.alloc_tmem((C, K), "float32")
            Vp_t = T.alloc_tmem((C, V), "float32")
            dAg_t = T.alloc_tmem((C, C), "float32")
            dUS_t = T.alloc_tmem((C, K), "float32")
            dPg_t = T.alloc_tmem((C, C), "float32")
            T1_t = T.alloc_tmem((C, K), "float32")
            bar = T.alloc_barrier([1, 1, 1, 1, 1, 1, 1])  # U, dq0, V', dAg, dU S0^T, dPg, T1 complete
            acc_a = T.alloc_fragment((C, V), "float32")  # U, then V', then dO S0^T, then dU S0^T
            acc_b = T.alloc_fragment((C, K), "float32")  # T1, then dk0
            acc_cc = T.alloc_fragment((C, C), "float32")  # dAg, then dPg
            prod_f = T.alloc_fragment((C, V), "float32")
            red_f = T.alloc_fragment((C,), "float32")
            gam_last = T.alloc_var("float32")
            row_sum = T.alloc_var("float32")
            ss = T.alloc_var("float32")
            kt1_sum = T.alloc_var("float32")

            t0 = chunk_bounds[c, 0]
            end = chunk_bounds[c, 1]
            hk = hv // group
            tx = T.get_thread_binding()

            if t0 < end:
                load_chunk(k, v, do, dvp, dv, A, h, dh, g_cumsum, beta, K_s, V_s, dO_s, dVp_s, dv_s, A_s, S0_s, dS_s,
                           gam_s, beta_s, Ag_s, gam_last, c, t0, end, hk, hv, C, K, V, dtype)

                # batch 1: U = K S0, dO S0^T
                T.fence_proxy_async()
                T.sync_threads()
                T.tcgen05_gemm(K_s, S0_s, U_t, clear_accum=True, mbar=bar[0])
                T.tcgen05_gemm(dO_s, S0_s, dq_t, transpose_B=True, clear_accum=True, mbar=bar[1])
                # dgam from e inside W; then W and dU in place (no product reads V_s or dv_s yet)
                T.mbarrier_wait_parity(bar[0], 0)
                T.tcgen05_after_thread_sync()
                T.copy(U_t, acc_a)
                w_and_du(acc_a, dv_s, V_s, gam_s, prod_f, red_f, dgu_s, C, V, dtype)

                # batch 2: V' = Ag W, dAg = dV' W^T, dU S0^T
                T.fence_proxy_async()
                T.sync_threads()
                T.tcgen05_gemm(Ag_s, V_s, Vp_t, clear_accum=True, mbar=bar[2])
                T.tcgen05_gemm(dVp_s, V_s, dAg_t, transpose_B=True, clear_accum=True, mbar=bar[3])
                T.tcgen05_gemm(dv_s, S0_s, dUS_t, transpose_B=True, clear_accum=True, mbar=bar[4])
                T.mbarrier_wait_parity(bar[2], 0)
                T.tcgen05_after_thread_sync()
                T.copy(Vp_t, acc_a)
                T.copy(acc_a, Vp_s)
                # batch 3: dPg = dO V'^T, T1 = V' dS^T
                T.fence_proxy_async()
                T.sync_threads()
                T.tcgen05_gemm(dO_s, Vp_s, dPg_t, transpose_B=True, clear_accum=True, mbar=bar[5])
                T.tcgen05_gemm(Vp_s, dS_s, T1_t, transpose_B=True, clear_accum=True, mbar=bar[6])

                # dq0 = scale diag(e) dO S0^T
                T.mbarrier_wait_parity(bar[1], 0)
                T.tcgen05_after_thread_sync()
                T.copy(dq_t, acc_a)
                store_dq0(dq0_out, acc_a, gam_s, scale, t0, end, hv, C, K)

                # dAg, dPg (fp32 out; the mask terms are formed in bwd_intra)
                T.mbarrier_wait_parity(bar[3], 0)
                T.tcgen05_after_thread_sync()
                T.copy(dAg_t, acc_cc)
                for i, j in T.Parallel(C, C):
                    if t0 + i < end:
                        dAg_out[t0 + i, hv, j] = acc_cc[i, j]
                T.mbarrier_wait_parity(bar[5], 0)
                T.tcgen05_after_thread_sync()
                T.copy(dPg_t, acc_cc)
                for i, j in T.Parallel(C, C):
                    if t0 + i < end:
                        dPg_out[t0 + i, hv, j] = acc_cc[i, j]

                # dk0 = diag(r) V' dS^T + dU S0^T, and the r-terms of dgam
                T.mbarrier_wait_parity(bar[6], 0)
                T.tcgen05_after_thread_sync()
                T.copy(T1_t, acc_b)
                kt1_terms(K_s, acc_b, gam_s, gam_last, prod_f, red_f, kt1_s, C, K)
                T.mbarrier_wait_parity(bar[4], 0)
                T.tcgen05_after_thread_sync()
                T.copy(dUS_t, acc_a)
                for i, j in T.Parallel(C, K):
                    acc_b[i, j] = acc_b[i, j] * T.exp(gam_last - gam_s[i]) + acc_a[i, j]
                for i, j in T.Parallel(C, K):
                    if t0 + i < end:
                        dk0_out[t0 + i, hv, j] = acc_b[i, j]

                # sum(dS .* S0) and the chunk's last row of dgam0
                store_dgam0(S0_s, dS_s, ss_s, kt1_s, dgu_s, gam_last, row_sum, ss, kt1_sum, dgam0_out,
                            tx, t0, end, hv, C, K, V)

    return compile_bwd(bwd_state, arch)
