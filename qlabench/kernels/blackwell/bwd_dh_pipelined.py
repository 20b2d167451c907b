"""bwd_dh_pipelined for sm100 / sm103: the reverse-over-chunks state-gradient pass with its five
products per chunk as tcgen05 MMAs into tensor memory; one block per (sequence, v-head, V tile).
Same signature, inputs and outputs as hopper/bwd_dh_pipelined.py.

Formula per chunk, last chunk first (dS = gradient of the state at the chunk END, K x BV fp32 in
registers, starting from dht; Pg = scale Gam .* Q K^T and Ag = Gam .* A_k .* beta_col come from
bwd_prepare in bf16; the factor table F holds F[0] = e = exp(gam) (F[0, C-1] = exp(gam_C)) and
F[1] = r = exp(gam_C - gam)):

    dh[c] = dS
    dV'   = diag(r) (K dS) + Pg^T dO         (gradient of v_new; stored for bwd_state)
    dv    = Ag^T dV'                         (the final dv)
    dU    = -diag(e) dv
    dS    = exp(gam_C) dS + K^T dU + Q^T (scale diag(e) dO)
    after the first chunk: dh0 = dS (always written; the host drops it without h0)

Products (bf16 operands in shared memory, fp32 accumulators in tensor memory, one mbarrier each):
    K dS         C x BV x K  -> KdS_t   (tcgen05.mma, asynchronous)
    Pg^T dO      C x BV x C  -> PdO_t   (Pg_s read transposed)
    Ag^T dV'     C x BV x C  -> dW_t    (Ag_s read transposed)
    K^T dU       K x BV x C  -> dSn_t   (fresh accumulator)
    Q^T eDO      K x BV x C  -> dSn_t   (accumulates onto K^T dU in tensor memory)
The per-row factor r on K dS and the decay of dS are applied in fp32 registers after the tcgen05.ld
read-back (Hopper did them on its register accumulators), so K dS and Pg^T dO have accumulators of
their own.
Loads: Q, K, dO, Pg, Ag and the factor row of the next (earlier) chunk come from TileLang's automatic
producer warpgroup (TMA, 2-stage ring). The producer refills a stage right after the statement that
reads it last and does not know a tcgen05 read is still in flight, so the last reader of each loaded
stage (Pg^T dO for Pg_s and dO_s, Ag^T dV' for Ag_s, K^T dU for K_s, Q^T eDO for Q_s) is issued with
``T.gemm(..., mbar=)`` on its tensor-memory accumulator: tcgen05 issue + wait in one statement.
Partial last chunk (the first one processed): rows past the sequence end are zeroed in shared memory
(read-modify-write selects, so they wait for the TMA loads) and dV' is cut there by a select.
Grid: (V / BV, N * H_v), BV = 64 (tcgen05's 64-row atoms need N >= 64 in TileLang 0.1.15: at BV = 32
its layout inference stops with "TCGEN05 meta not initialized"), so backward._value_tile keeps 64 on
sm100 where sm90 narrows to 32 for small grids.
Threads: 128 consumer (one warpgroup) + 128 producer. scale is a runtime argument.
tcgen05 evidence (TileLang 0.1.15, nvcc 13.0, sm_100a, compiled on a CPU-only machine, never run on
hardware): the generated CUDA holds ``tl::tcgen05mma_ws_ss`` / ``tl::tcgen05mma_ss`` (tcgen05.mma),
``tl::tcgen05_mma_arrive`` (tcgen05.commit) and ``tl::tcgen05_ld_32dp32bNx`` (tcgen05.ld), no
mma.sync and no wgmma; SASS (cuobjdump -sass, hk1_hv2 bf16):
32 UTCHMMA.WS + 16 UTCHMMA, 4 LDTM, 24 UTMALDG, no HMMA; no local-memory spills.
Checked on every CI run by tests/kernels/test_aot_blackwell.py (source; SASS where cuobjdump is
installed). Shared memory per block as compiled: 165,888 B.
The loads and elementwise steps that do not depend on how products are issued are TileLang macros
in common/bwd_dh.py, shared with hopper/bwd_dh_pipelined.py.
"""

import functools

import tilelang.language as T

from ..common.bwd_dh import dw_du, load_chunk, store_dvp_dv, store_state
from ..common.bwd_h import reverse_run, sequence_block
from ..hopper.bwd_common import compile_bwd


@functools.cache
def bwd_dh_pipelined_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str, arch: str):
    if BV < 64 or C != 64 or K != 128:
        raise ValueError(f"the sm100 bwd_dh is written for BV >= 64, C = 64, K = 128 (got BV={BV}, C={C}, K={K})")
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
        dv_out: T.Tensor((n_tok, h_v, V), dtype),
        dh0_out: T.Tensor((n_seq, h_v, K, V), "float32"),
        scale: T.float32,
        has_skip: T.int32,
    ):
        with T.Kernel(NV, (n_cu - 1) * h_v, threads=128) as (iv, nh):
            Q_s = T.alloc_shared((C, K), dtype)
            K_s = T.alloc_shared((C, K), dtype)
            dO_s = T.alloc_shared((C, BV), dtype)
            Pg_s = T.alloc_shared((C, C), dtype)
            Ag_s = T.alloc_shared((C, C), dtype)
            F_s = T.alloc_shared((3, C), "float32")
            dS_s = T.alloc_shared((K, BV), dtype)
            dVp_s = T.alloc_shared((C, BV), dtype)
            dW_s = T.alloc_shared((C, BV), dtype)
            dU_s = T.alloc_shared((C, BV), dtype)
            eDO_s = T.alloc_shared((C, BV), dtype)
            KdS_t = T.alloc_tmem((C, BV), "float32")
            PdO_t = T.alloc_tmem((C, BV), "float32")
            dW_t = T.alloc_tmem((C, BV), "float32")
            dSn_t = T.alloc_tmem((K, BV), "float32")
            bar = T.alloc_barrier([1, 1, 1, 1, 1])  # K dS, Pg^T dO, Ag^T dV', K^T dU, Q^T eDO complete
            dS_f = T.alloc_fragment((K, BV), "float32")
            dSn_f = T.alloc_fragment((K, BV), "float32")
            dVp_f = T.alloc_fragment((C, BV), "float32")
            PdO_f = T.alloc_fragment((C, BV), "float32")
            dW_f = T.alloc_fragment((C, BV), "float32")

            n, h, hk, v0, bos, eos, cbase = sequence_block(cu_seqlens, chunk_offsets, seq_order, iv, nh, h_v, group, BV)
            n_chunks = reverse_run(bos, eos, C, chunk_skip, has_skip, n, h)

            T.copy(dht[n, h, :, v0:v0 + BV], dS_f)

            for cr in T.Pipelined(n_chunks, num_stages=2):
                c = n_chunks - 1 - cr
                t0 = bos + c * C
                ph = cr % 2  # each barrier completes once per chunk
                # rows past the sequence end zeroed by read-modify-write selects (see load_chunk)
                load_chunk(q, k, do, Pg, Ag, fac, Q_s, K_s, dO_s, Pg_s, Ag_s, F_s, c, t0, eos, cbase, hk, h, v0,
                           C, K, BV, dtype)

                store_state(dS_f, dS_s, dh_out, eDO_s, F_s, dO_s, scale, c, cbase, h, v0, C, BV, dtype)
                T.fence_proxy_async()
                T.sync_threads()
                T.tcgen05_gemm(K_s, dS_s, KdS_t, clear_accum=True, mbar=bar[0])
                # last reader of Pg_s and dO_s: issue + wait in one statement (see the header)
                T.gemm(Pg_s, dO_s, PdO_t, transpose_A=True, clear_accum=True, mbar=bar[1])
                T.mbarrier_wait_parity(bar[0], ph)
                T.tcgen05_after_thread_sync()
                T.copy(KdS_t, dVp_f)
                T.mbarrier_wait_parity(bar[1], ph)
                T.tcgen05_after_thread_sync()
                T.copy(PdO_t, PdO_f)
                for i, j in T.Parallel(C, BV):
                    dVp_s[i, j] = T.if_then_else(
                        t0 + i < eos, T.cast(dVp_f[i, j] * F_s[1, i] + PdO_f[i, j], dtype), T.cast(0, dtype))
                T.fence_proxy_async()
                T.sync_threads()
                T.gemm(Ag_s, dVp_s, dW_t, transpose_A=True, clear_accum=True, mbar=bar[2])  # last reader of Ag_s
                T.mbarrier_wait_parity(bar[2], ph)
                T.tcgen05_after_thread_sync()
                T.copy(dW_t, dW_f)
                dw_du(dW_f, F_s, dW_s, dU_s, C, BV, dtype)
                T.fence_proxy_async()
                T.sync_threads()
                T.gemm(K_s, dU_s, dSn_t, transpose_A=True, clear_accum=True, mbar=bar[3])  # last reader of K_s
                T.gemm(Q_s, eDO_s, dSn_t, transpose_A=True, mbar=bar[4])  # accumulates; last reader of Q_s
                store_dvp_dv(dVp_s, dW_s, dvp_out, dv_out, t0, eos, h, v0, C, BV)

                T.mbarrier_wait_parity(bar[4], ph)
                T.tcgen05_after_thread_sync()
                T.copy(dSn_t, dSn_f)
                for i, j in T.Parallel(K, BV):
                    dS_f[i, j] = dS_f[i, j] * F_s[0, C - 1] + dSn_f[i, j]

            T.copy(dS_f, dh0_out[n, h, :, v0:v0 + BV])

    return compile_bwd(bwd_dh_pipelined, arch)
