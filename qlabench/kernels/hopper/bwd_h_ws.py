"""bwd_h_ws: the backward's h-only state recompute, manually warp-specialized (Hopper, sm_90a).

The sm90 ``bwd_h`` (dispatch.KERNEL_MODULES). Computes no o: only the per-chunk start states h, for
bwd_dh and bwd_state.

Formula per chunk (gate-free A_k; e_C = exp(gam_C), r = exp(gam_C - gam) and beta (zero past the
sequence end) from bwd_prepare's per-chunk factor table; S is K x BV fp32 in registers):

    h[c] = S
    X    = diag(beta) A_k^T K                  (C x K, = (A_k diag(beta))^T K; depends on no state: off the
                                                serial chain)
    Y    = diag(r) V - e_C K S                 (C x BV)
    S    = e_C S + X^T Y

This is the update S = e_C S + K^T (A_k diag(beta)) Y of blackwell/bwd_h_pipelined.py with K^T A_k diag(beta)
formed first, by a warpgroup of its own, so the serial chain per chunk is two GEMMs (K S, X^T Y)
instead of three. V tiling is exact (X is the same for every V tile).

Same signature and grid as blackwell/bwd_h_pipelined.py: (k, v, A, fac, cu_seqlens, chunk_offsets, h0, h_out);
grid (V / BV, N * H_v), one block per (sequence, v-head, V tile). Rows past the sequence end (next
sequence or padding tail, loaded whole by TMA) are kept out: Y's rows there are a select (zero), and
K's and A's rows there are zeroed before X = A_k^T K, so non-finite data cannot leak in; A_k's rows of
the sequence hold exact zeros above the diagonal (kkt_solve writes each row whole), so no column mask
is needed. (The state warpgroup's K S may read those K rows before or after the zeroing; its rows
there are discarded by Y's select either way.)

Warp-group roles (384 threads = 3 warpgroups, split by thread index; no block-wide barrier after the
prologue):
  * WG0 producer (tx 0..127, set_max_nreg 40 dec): for chunk c into ring slot c % 2, waits
    empty[slot]; one elected thread issues T.tma_copy of K, V, A on full[slot]; threads 0..C-1 load the
    chunk's factor rows (e, r, beta) into F_s[slot]; all 128 arrive on full[slot].
  * WG1 state (tx 128..255, set_max_nreg 216 inc): owns S. The only serial chain:
    S -> S_s[b] -> K S -> Y -> X^T Y -> S.
  * WG2 transition (tx 256..383, set_max_nreg 216 inc): X = A_k^T K (wgmma straight from the TMA'd
    A tile), rows scaled by beta in registers, into X_s[b]; then h[c] from S_s[b] to global memory.
Per-chunk stage order (slot = b = c % 2, ph = (c // 2) & 1; the phase "freed by the use two chunks
ago" is ph ^ 1, which a fresh barrier passes at once):
  producer:    wait empty[slot] (ph ^ 1) -> TMA K, V, A -> F_s[slot] -> arrive full[slot]
  state:       wait full[slot] (ph); wait h_free[b] (ph ^ 1)
               S_s[b] = bf16(S); fence; bar.sync(1, 128); arrive s_ready[b]
               KS = K S (wgmma issued); V_f = r V (registers, under the wgmma); wait;
               KS_f = rows(V_f - e_C KS); Y_s = bf16(KS_f) (stmatrix); fence; bar.sync(1, 128)
               wait x_ready[b] (ph); S = e_C S + X_s[b]^T Y_s (wgmma); arrive x_free[b]; arrive empty[slot]
  transition:  wait full[slot] (ph); wait x_free[b] (ph ^ 1)
               partial chunk only: K_s, A_s rows past eos = 0; fence; bar.sync(2, 128)
               X = A^T K (wgmma); X *= beta_row; X_s[b] = bf16(X); fence; bar.sync(2, 128); arrive x_ready[b]
               wait s_ready[b] (ph); h[c] = S_s[b]; arrive h_free[b]; arrive empty[slot]
Barriers (mbarrier arrive counts): full[2] = 128 (+ TMA bytes), empty[2] = 256 (state + transition),
s_ready[2] = x_free[2] = 128 (state), x_ready[2] = h_free[2] = 128 (transition). Named barriers 1 and 2:
each compute warpgroup's own smem writes before its wgmma reads. TileLang's automatic shared-memory
syncs are off (TL_DISABLE_THREAD_STORAGE_SYNC): every hazard is covered by the barriers above.

GEMMs per chunk (wgmma, smem operands, fp32 accumulate): state K S 64xBVx128, X^T Y 128xBVx64;
transition A^T K 64x128x64.
Element-wise steps read shared memory into registers and write shared memory in separate loops: one loop
that reads V_s (or A_s) and writes Y_s (or Ab_s) is serialised by their possible aliasing. H200 session
32, clock64 probes at hk16_hv64 1x32768 BV 64 (results/h200/2026-12-04_s32/): Y -> Y_s took 1672 cycles
per chunk of the state warpgroup's 3900, Ab_s 2221 of the transition's; the kernel alone 2.01 us per
chunk step.
Shared memory (bf16 = 2 bytes; C = 64, K = 128):
    ring (2 slots): K 2 x 16 KB, V 2 x C BV 2, A 2 x 8 KB, factors 2 x 768 B
    S_s 2 x K BV 2, X_s 2 x 16 KB, Y_s C BV 2
  BV = 64: 32 + 16 + 16 + 1.5 + 32 + 32 + 8 = 137.5 KB;  BV = 32: 32 + 8 + 16 + 1.5 + 16 + 32 + 4
  = 109.5 KB (``shared_memory_bytes``). One block per SM at BV = 64, one or two at BV = 32.
Registers: S (K x BV fp32) 64 / 32 per state thread, KS and V_f 32 / 16 each; X (C x K fp32) 64 per
transition thread. Quotas 40 + 216 + 216 = 472 <= 3 x 168.
"""

import functools

import tilelang.language as T
from tilelang import PassConfigKey

from ..common.build import compile_for
from ..common.bwd_h import sequence_block

THREADS = 384  # producer, state, transition warpgroups
NREG_PRODUCER = 40
NREG_STATE = 216
NREG_TRANSITION = 216
BAR_STATE = 1  # named barrier ids (0 is __syncthreads)
BAR_TRANSITION = 2
STAGES = 2  # input ring depth; 4 measured slower on the H200 (hk16_hv16 1x32768 BV 32: 924 vs 876 us)


def shared_memory_bytes(K: int, BV: int, C: int = 64, elem: int = 2) -> int:
    """Dynamic shared memory of the kernel, from its allocations (the mbarriers are static)."""
    ring = STAGES * ((C * K + C * BV + C * C) * elem + 3 * C * 4)  # K, V, A, factors per slot
    handoff = 2 * (K * BV + C * K) * elem  # S_s, X_s per parity
    scratch = C * BV * elem  # Y_s
    return ring + handoff + scratch


@functools.cache
def bwd_h_ws_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str, arch: str):
    """Compiled h-only recompute for one head configuration (runtime arguments as blackwell/bwd_h_pipelined.py)."""
    NS = STAGES
    if C != 64:
        raise ValueError(f"bwd_h_ws is written for C = 64 (one m64 wgmma per row block), got {C}")
    group = h_v // h_qk
    NV = V // BV
    n_tok = T.dynamic("n_tok")
    n_cu = T.dynamic("n_cu")
    n_ord = T.dynamic("n_ord")
    n_seq = T.dynamic("n_seq")
    n_hc = T.dynamic("n_hc")
    n_fc = T.dynamic("n_fc")

    @T.macro
    def produce(slot: int, c, n_run, bos, cbase, h, hk, v0, tx, k, v, A, fac, K_s, V_s, A_s, F_s, full,
                empty):
        if c < n_run:
            T.mbarrier_wait_parity(empty[slot], ((c // NS) & 1) ^ 1)
            t0 = bos + c * C
            T.tma_copy(k[t0:t0 + C, hk, :], K_s, barrier=full[slot])
            T.tma_copy(v[t0:t0 + C, h, v0:v0 + BV], V_s, barrier=full[slot])
            T.tma_copy(A[t0:t0 + C, h, :], A_s, barrier=full[slot])
            if tx < C:
                for f in T.serial(3):
                    F_s[f, tx] = fac[cbase + c, h, f, tx]
            T.mbarrier_arrive(full[slot])

    @T.macro
    def state_step(slot: int, b: int, c, n_run, bos, eos, K_s, V_s, F_s, S_s, X_s, Y_s, S_f, KS_f, V_f, full,
                   empty, s_ready, x_ready, x_free, h_free):
        if c < n_run:
            ph = (c // 2) & 1
            t0 = bos + c * C
            T.mbarrier_wait_parity(full[slot], (c // NS) & 1)
            T.mbarrier_wait_parity(h_free[b], ph ^ 1)
            T.copy(S_f, S_s)
            T.fence_proxy_async()
            T.sync_threads(BAR_STATE, 128)
            T.mbarrier_arrive(s_ready[b])

            # K S in flight while diag(r) V is read into registers: a loop that reads V_s and writes Y_s is
            # serialised by the possible aliasing (1700-2000 cycles per chunk, H200 session 32 probes)
            T.wgmma_gemm(K_s, S_s, KS_f, clear_accum=True)
            for i, j in T.Parallel(C, BV):
                V_f[i, j] = F_s[1, i] * V_s[i, j]
            T.wait_wgmma(0)
            for i, j in T.Parallel(C, BV):
                KS_f[i, j] = T.if_then_else(t0 + i < eos, V_f[i, j] - F_s[0, C - 1] * KS_f[i, j], 0.0)
            T.copy(KS_f, Y_s)
            T.fence_proxy_async()
            T.sync_threads(BAR_STATE, 128)

            T.mbarrier_wait_parity(x_ready[b], ph)
            for i, j in T.Parallel(K, BV):
                S_f[i, j] = S_f[i, j] * F_s[0, C - 1]
            T.gemm(X_s, Y_s, S_f, transpose_A=True)
            T.mbarrier_arrive(x_free[b])
            T.mbarrier_arrive(empty[slot])

    @T.macro
    def transition_step(slot: int, b: int, c, n_run, bos, eos, cbase, h, v0, h_out, K_s, A_s, F_s, S_s, X_s,
                        X_f, full, empty, s_ready, x_ready, x_free, h_free):
        if c < n_run:
            ph = (c // 2) & 1
            t0 = bos + c * C
            T.mbarrier_wait_parity(full[slot], (c // NS) & 1)
            T.mbarrier_wait_parity(x_free[b], ph ^ 1)
            if t0 + C > eos:  # a partial chunk: K's and A's rows past its end (next sequence or padding tail) = 0
                for i, d in T.Parallel(C, K):
                    if t0 + i >= eos:
                        K_s[i, d] = T.cast(0, dtype)
                for i, j in T.Parallel(C, C):
                    if t0 + i >= eos:
                        A_s[i, j] = T.cast(0, dtype)
                T.fence_proxy_async()
                T.sync_threads(BAR_TRANSITION, 128)
            # X = diag(beta) (A_k^T K): A_k's rows hold zeros above the diagonal (kkt_solve writes them whole)
            T.gemm(A_s, K_s, X_f, transpose_A=True, clear_accum=True)
            for i, d in T.Parallel(C, K):
                X_f[i, d] = X_f[i, d] * F_s[2, i]
            T.copy(X_f, X_s)
            T.fence_proxy_async()
            T.sync_threads(BAR_TRANSITION, 128)
            T.mbarrier_arrive(x_ready[b])

            T.mbarrier_wait_parity(s_ready[b], ph)
            for i, j in T.Parallel(K, BV):
                h_out[cbase + c, h, i, v0 + j] = S_s[i, j]
            T.mbarrier_arrive(h_free[b])
            T.mbarrier_arrive(empty[slot])

    def bwd_h_ws(
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
        with T.Kernel(NV, (n_cu - 1) * h_v, threads=THREADS) as (iv, nh):
            K0 = T.alloc_shared((C, K), dtype)
            K1 = T.alloc_shared((C, K), dtype)
            V0 = T.alloc_shared((C, BV), dtype)
            V1 = T.alloc_shared((C, BV), dtype)
            A0 = T.alloc_shared((C, C), dtype)
            A1 = T.alloc_shared((C, C), dtype)
            F0 = T.alloc_shared((3, C), "float32")
            F1 = T.alloc_shared((3, C), "float32")
            S0 = T.alloc_shared((K, BV), dtype)
            S1 = T.alloc_shared((K, BV), dtype)
            X0 = T.alloc_shared((C, K), dtype)
            X1 = T.alloc_shared((C, K), dtype)
            Y_s = T.alloc_shared((C, BV), dtype)
            full = T.alloc_barrier([128] * NS)
            empty = T.alloc_barrier([256] * NS)
            s_ready = T.alloc_barrier([128, 128])
            x_ready = T.alloc_barrier([128, 128])
            x_free = T.alloc_barrier([128, 128])
            h_free = T.alloc_barrier([128, 128])
            S_f = T.alloc_fragment((K, BV), "float32")
            KS_f = T.alloc_fragment((C, BV), "float32")
            V_f = T.alloc_fragment((C, BV), "float32")
            X_f = T.alloc_fragment((C, K), "float32")

            tx = T.get_thread_binding()
            n, h, hk, v0, bos, eos, cbase = sequence_block(cu_seqlens, chunk_offsets, seq_order, iv, nh, h_v, group, BV)
            n_run = T.max(T.ceildiv(eos - bos, C), 0)
            n_rounds = T.ceildiv(n_run, NS)

            # the chunk loop runs in pairs (chunk 2 p + slot) so every ring buffer index is a Python constant
            if tx < 128:
                T.set_max_nreg(NREG_PRODUCER, 0)
                for p in T.serial(n_rounds):
                    produce(0, 2 * p, n_run, bos, cbase, h, hk, v0, tx, k, v, A, fac, K0, V0,
                            A0, F0, full, empty)
                    produce(1, 2 * p + 1, n_run, bos, cbase, h, hk, v0, tx, k, v, A, fac, K1, V1,
                            A1, F1, full, empty)
            elif tx < 256:
                T.set_max_nreg(NREG_STATE, 1)
                for i, j in T.Parallel(K, BV):
                    S_f[i, j] = h0[n, h, i, v0 + j]
                for p in T.serial(n_rounds):
                    state_step(0, 0, 2 * p, n_run, bos, eos, K0, V0, F0, S0,
                               X0, Y_s, S_f, KS_f, V_f, full, empty, s_ready, x_ready, x_free, h_free)
                    state_step(1, 1, 2 * p + 1, n_run, bos, eos, K1, V1, F1, S1,
                               X1, Y_s, S_f, KS_f, V_f, full, empty, s_ready, x_ready, x_free, h_free)
            else:
                T.set_max_nreg(NREG_TRANSITION, 1)
                for p in T.serial(n_rounds):
                    transition_step(0, 0, 2 * p, n_run, bos, eos, cbase, h, v0, h_out, K0,
                                    A0, F0, S0, X0, X_f, full, empty, s_ready,
                                    x_ready, x_free, h_free)
                    transition_step(1, 1, 2 * p + 1, n_run, bos, eos, cbase, h, v0, h_out, K1,
                                    A1, F1, S1, X1, X_f, full, empty, s_ready,
                                    x_ready, x_free, h_free)

    return compile_for(T.prim_func(bwd_h_ws), arch, {PassConfigKey.TL_DISABLE_THREAD_STORAGE_SYNC: True})
