"""chunk_fwd for sm100 / sm103: the forward chunk recurrence with every GEMM on tcgen05 into tensor
memory. One block per (sequence, v-head, V tile); same signature and semantics as hopper/chunk_fwd.py.

Formula per chunk (gam = in-chunk cumsum of g, e = exp(gam), r = exp(gam_C - gam),
Gam[i, j] = exp(gam_i - gam_j) for j <= i else 0; S is K x BV, fp32):

    U  = K S                      W  = V - diag(e) U
    Vd = Ag W                     (Ag = Gam .* A_k .* beta_col, from kkt_solve)
    O  = scale diag(e) (Q S) + Pm Vd              (Pm = scale Gam .* Q K^T, from kkt_solve)
    S  = exp(gam_C) S + K^T (diag(r) Vd)

How it maps onto sm100:
  * The state S stays in fp32 registers across chunks (as on Hopper); each chunk it is written once
    as a bf16 operand S_s to shared memory.
  * Five products per chunk, each a ``T.tcgen05_gemm`` with bf16 operands in shared memory and a
    fresh (clear_accum) fp32 accumulator in tensor memory, each posting completion to its own
    mbarrier (one completion per chunk, so chunk c waits for parity c % 2):
        K S        C x BV x K   -> U_t      (bar 0)
        Q S        C x BV x K   -> QS_t     (bar 1, issued together with K S; read back last)
        Ag W       C x BV x C   -> Vd_t     (bar 2)
        Pm Vd      C x BV x C   -> PV_t     (bar 3)
        K^T Vr     K x BV x C   -> KV_t     (bar 4, A = K_s read transposed: an MN-major descriptor)
    The combinations that Hopper did with an accumulating GEMM (O = scale e (Q S) + Pm Vd and
    S = exp(gam_C) S + K^T Vr) are done in registers after the tensor-memory read-back (tcgen05.ld),
    so the per-row scale e and the decay are applied in fp32 exactly as on Hopper.
    Q S and K S are issued back to back; Pm Vd and K^T Vr too: the tensor core runs the second while
    the threads read back the first.
  * Every product is waited on within its chunk, so no tensor-core read of a shared buffer crosses a
    chunk boundary; operands written by threads are followed by fence.proxy.async + a block barrier
    before the MMA is issued (TileLang also inserts the fence itself next to the descriptors).
  * Rows past the sequence end: selects, never multiplication by zero (as on Hopper); K's padded rows
    are zeroed after K S has completed and before K^T Vr is issued.
Two variants of one loop (``pipelined``), as on Hopper: pipelined = ``T.Pipelined(num_stages=2)``,
whose automatic producer warpgroup loads Q, K, V, Ag, Pm of chunk c + 1 with TMA while chunk c
computes (tcgen05 issue and TMEM read-back stay in the consumer warpgroups); plain = loads in line.
V tiles narrower than 64 (BV = 32, which forward.py picks for small grids): TileLang 0.1.15 offers
64-row tcgen05 atoms only for N >= 64, so such a block computes a 64-column window of V that lies in
[0, V) and contains its own BV columns (window start min(iv BV, V - 64)), and stores only its own
columns of o, h and the final state. Columns are independent, so the result is exact; the cost is
twice the tensor-core work per block on grids that are small anyway.
Grid: (V / BV, N * H_v), grid row r running sequence seq_order[r] (longest chain first, as on hopper).
Threads: 128 (one warpgroup: it issues the MMAs from one elected thread of its first warp and reads the accumulators back from tensor memory, lanes split by warp) + 128 producer
threads in the pipelined variant.
Tensor memory: five fp32 accumulators; TileLang allocates the columns per buffer (BV <= 64: 64 for
K^T Vr + 4 x 32 for the 64-row ones; BV = 128: 128 + 4 x 64 = 384 of 512).
Shared memory per block as compiled (dynamic, from the generated host code): plain 98,560 B at
BV <= 64, 147,712 B at BV = 128; pipelined (double-buffered Q, K, V, Ag, Pm) 156,672 B at BV <= 64,
214,016 B at BV = 128 (sm100 allows 232,448 B), so one pipelined block per SM.
Chunk skip (``has_skip`` != 0, for the CP warm-up of forward_cp.py): as on Hopper (see its header).

tcgen05 evidence (TileLang 0.1.15, nvcc 13.0, target sm_100a, compiled on a CPU-only machine, never
run on Blackwell hardware):
  * generated CUDA (``kernel.get_kernel_source()``): ``tl::tcgen05mma_ws_ss`` (64-row products) and
    ``tl::tcgen05mma_ss`` (the 128-row K^T Vr) = tcgen05.mma.cta_group::1.kind::f16 for all five
    products, ``tl::tcgen05_mma_arrive`` (tcgen05.commit -> mbarrier) after each, ``tl::tcgen05_ld_
    32dp32bNx`` (tcgen05.ld) for the five read-backs, ``tl::tmem_allocate`` / ``tmem_deallocate``; no
    ``mma_sync`` and no wgmma. The pipelined variant's producer issues ``tl::tma_load``.
  * SASS (cuobjdump -sass of the cubin in the TileLang cache), hk1_hv2 bf16 BV = 64, K-V state layout:
    pipelined 48 UTCHMMA.WS + 8 UTCHMMA, 5 LDTM, 6 UTCBAR, 7 UTMALDG.3D, no HMMA; plain 40 UTCHMMA.WS
    + 4 UTCHMMA, 5 LDTM, no HMMA. (The Hopper file compiled for sm_100a instead: 28-56 HMMA.16816, no
    UTCHMMA.)
  * tests/kernels/test_aot_blackwell.py re-checks the source on every CI run, and the SASS where
    cuobjdump + nvdisasm are installed.
The loads and elementwise steps that do not depend on how products are issued are TileLang macros
in common/chunk_fwd.py, shared with hopper/chunk_fwd.py.
"""

import functools

import tilelang.language as T

from ..common.build import compile_for
from ..common.chunk_fwd import form_vd_vr, form_w, load_chunk, load_state


@functools.cache
def chunk_fwd_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str, state_v_first: bool,
                     arch: str, pipelined: bool = False):
    """Compiled forward for one head configuration (same arguments as hopper's ``chunk_fwd_kernel``).

    Kernel arguments: (q, k, v, g_cumsum, Ag, Pm, cu_seqlens, chunk_offsets, seq_order, chunk_skip, h0, o, ht,
    h_out, scale, has_h0, store_final, store_h, has_skip)."""
    name = "chunk_fwd_pipelined" if pipelined else "chunk_fwd"
    if C != 64 or K != 128:
        raise ValueError(f"the sm100 chunk_fwd is written for C = 64, K = 128 (got C = {C}, K = {K})")

    group = h_v // h_qk
    THREADS = 128
    # tcgen05 in TileLang 0.1.15 has 64-row atoms only with N >= 64: narrower V tiles compute on a
    # 64-column window inside [0, V) that contains the block's columns and store only those
    MW = max(BV, 64)
    if V % BV or V < MW:
        raise ValueError(f"V = {V} must be a multiple of BV = {BV} and at least {MW}")
    NV = V // BV
    n_tok = T.dynamic("n_tok")
    n_cu = T.dynamic("n_cu")
    n_h0 = T.dynamic("n_h0")
    n_ht = T.dynamic("n_ht")
    n_hc = T.dynamic("n_hc")
    n_skip = T.dynamic("n_skip")
    n_ord = T.dynamic("n_ord")
    state_shape = (h_v, V, K) if state_v_first else (h_v, K, V)

    def own(lo, j):
        """window column j is one of the block's own BV columns (always, when BV >= 64)."""
        return T.And(lo <= j, j < lo + BV)

    def mma(A, B, acc, mbar, transpose_A=False, last_use=False):
        """acc = A B on tcgen05 (fresh accumulator), completion posted to ``mbar``.

        In the pipelined variant TileLang's producer refills an input stage right after the statement
        that reads it last, and it cannot see that a tcgen05 read is still in flight then: the last
        product reading a loaded stage is issued with the synchronous form (``T.gemm`` into tensor
        memory with ``mbar``: issue + wait in one statement). Everything else is issued
        asynchronously and waited on explicitly (mbarrier parity wait, then
        tcgen05.fence::after_thread_sync before the tensor-memory read-back; after a synchronous issue
        the same wait returns at once)."""
        if pipelined and last_use:
            return T.gemm(A, B, acc, transpose_A=transpose_A, clear_accum=True, mbar=mbar)
        return T.tcgen05_gemm(A, B, acc, transpose_A=transpose_A, clear_accum=True, mbar=mbar)

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
            V_s = T.alloc_shared((C, MW), dtype)
            S_s = T.alloc_shared((K, MW), dtype)
            W_s = T.alloc_shared((C, MW), dtype)
            Vd_s = T.alloc_shared((C, MW), dtype)
            Vr_s = T.alloc_shared((C, MW), dtype)
            P_s = T.alloc_shared((C, C), dtype)
            Ag_s = T.alloc_shared((C, C), dtype)
            gam_s = T.alloc_shared((C,), "float32")
            U_t = T.alloc_tmem((C, MW), "float32")
            QS_t = T.alloc_tmem((C, MW), "float32")
            Vd_t = T.alloc_tmem((C, MW), "float32")
            PV_t = T.alloc_tmem((C, MW), "float32")
            KV_t = T.alloc_tmem((K, MW), "float32")
            bar = T.alloc_barrier([1, 1, 1, 1, 1])  # K S, Q S, Ag W, Pm Vd, K^T Vr complete
            S_f = T.alloc_fragment((K, MW), "float32")
            KV_f = T.alloc_fragment((K, MW), "float32")
            U_f = T.alloc_fragment((C, MW), "float32")
            O_f = T.alloc_fragment((C, MW), "float32")
            PV_f = T.alloc_fragment((C, MW), "float32")
            gam_last = T.alloc_var("float32")

            n = seq_order[nh // h_v]
            h = nh % h_v
            hk = h // group
            v0 = T.min(iv * BV, V - MW)  # first column of the computed window
            lo = iv * BV - v0  # the block's own columns: window columns lo .. lo + BV - 1 (lo = 0 if BV >= 64)
            bos = cu_seqlens[n]
            eos = cu_seqlens[n + 1]
            # first chunk run; the row index is guarded too, so a [1, H_v] dummy is never over-read
            skip_row = T.if_then_else(has_skip != 0, n, 0)
            skip = T.max(T.if_then_else(has_skip != 0, chunk_skip[skip_row, h], 0), 0)
            n_run = T.max(T.ceildiv(eos - bos, C) - skip, 0)

            load_state(S_f, h0, has_h0, n, h, v0, K, MW, state_v_first)

            for c in (T.Pipelined(n_run, num_stages=2) if pipelined else T.serial(n_run)):
                t0 = bos + (skip + c) * C
                ph = c % 2  # each barrier completes once per chunk
                load_chunk(q, k, v, Ag, Pm, g_cumsum, Q_s, K_s, V_s, Ag_s, P_s, gam_s, t0, eos, h, hk, v0, C, MW)
                T.copy(S_f, S_s)
                if store_h != 0:
                    for i, j in T.Parallel(K, MW):
                        if own(lo, j):
                            if state_v_first:
                                h_out[chunk_offsets[n] + skip + c, h, v0 + j, i] = S_s[i, j]
                            else:
                                h_out[chunk_offsets[n] + skip + c, h, i, v0 + j] = S_s[i, j]
                gam_last = gam_s[C - 1]
                T.fence_proxy_async()
                T.sync_threads()
                T.tcgen05_gemm(K_s, S_s, U_t, clear_accum=True, mbar=bar[0])
                mma(Q_s, S_s, QS_t, bar[1], last_use=True)  # Q_s: last read this chunk

                T.mbarrier_wait_parity(bar[0], ph)
                T.tcgen05_after_thread_sync()
                T.copy(U_t, U_f)
                form_w(V_s, U_f, gam_s, W_s, has_h0, t0, eos, C, MW, dtype)
                T.fence_proxy_async()
                T.sync_threads()
                mma(Ag_s, W_s, Vd_t, bar[2], last_use=True)  # Ag_s: last read
                T.mbarrier_wait_parity(bar[2], ph)
                T.tcgen05_after_thread_sync()
                T.copy(Vd_t, U_f)  # U_f now holds Vd
                form_vd_vr(U_f, gam_s, gam_last, Vd_s, Vr_s, K_s, t0, eos, C, K, MW, dtype)  # K S has completed (bar 0): K's padded rows may be zeroed now
                T.fence_proxy_async()
                T.sync_threads()
                mma(K_s, Vr_s, KV_t, bar[4], transpose_A=True, last_use=True)  # K_s: last read
                mma(P_s, Vd_s, PV_t, bar[3], last_use=True)  # P_s: last read

                T.mbarrier_wait_parity(bar[1], ph)
                T.tcgen05_after_thread_sync()
                T.copy(QS_t, O_f)
                T.mbarrier_wait_parity(bar[3], ph)
                T.tcgen05_after_thread_sync()
                T.copy(PV_t, PV_f)
                for i, j in T.Parallel(C, MW):
                    if t0 + i < eos and own(lo, j):
                        o[t0 + i, h, v0 + j] = T.cast(O_f[i, j] * (scale * T.exp(gam_s[i])) + PV_f[i, j], dtype)

                T.mbarrier_wait_parity(bar[4], ph)
                T.tcgen05_after_thread_sync()
                T.copy(KV_t, KV_f)
                for i, j in T.Parallel(K, MW):
                    S_f[i, j] = S_f[i, j] * T.exp(gam_last) + KV_f[i, j]

            if store_final != 0:
                for i, j in T.Parallel(K, MW):
                    if own(lo, j):
                        if state_v_first:
                            ht[n, h, v0 + j, i] = S_f[i, j]
                        else:
                            ht[n, h, i, v0 + j] = S_f[i, j]

            if n == n_cu - 2:
                for c in T.serial(T.ceildiv(n_tok - eos, C)):
                    for i, j in T.Parallel(C, MW):
                        if eos + c * C + i < n_tok and own(lo, j):
                            o[eos + c * C + i, h, v0 + j] = T.cast(0, dtype)

    chunk_fwd.__name__ = chunk_fwd.__qualname__ = name  # the kernel's name in profiles
    return compile_for(T.prim_func(chunk_fwd), arch)


@functools.cache
def chunk_fwd_pipelined_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str,
                               state_v_first: bool, arch: str):
    """The pipelined variant of ``chunk_fwd_kernel`` (its own kernel role in dispatch)."""
    return chunk_fwd_kernel(h_qk, h_v, K, V, BV, C, dtype, state_v_first, arch, True)
