"""chunk_fwd_ws: the forward chunk recurrence, manually warp-specialized (Hopper, sm_90a).

The sm90 forward's default recurrence (forward.recurrence_role; KernelOptions.fwd_kernel picks
another). The forward GPU tests (tests/kernels/test_forward_gpu.py: varlen, partial chunks, empty
sequence, padding tail, h0, both state layouts, BV 32 and 64, qwen strong decay, T = 32768) run it
by default; its timings against chunk_fwd_pipelined are in results/h200/NOTES.md. Register quotas
and ring depth are the first choice, not tuned by measurement.

Formula per chunk (as chunk_fwd.py; gam = in-chunk cumsum of g clamped to the sequence's last real
token, e = exp(gam), r = exp(gam_C - gam), S is K x BV fp32, Ag and Pm from kkt_solve):

    U  = K S                      W  = V - diag(e) U
    Vd = Ag W
    O  = scale diag(e) Q S + Pm Vd
    S  = exp(gam_C) S + K^T diag(r) Vd

Same kernel signature and grid as chunk_fwd.py: (q, k, v, g_cumsum, Ag, Pm, cu_seqlens, chunk_offsets,
seq_order, chunk_skip, h0, o, ht, h_out, scale, has_h0, store_final, store_h, has_skip); grid (V / BV, N * H_v),
one block per (sequence, v-head, V tile), grid row r running sequence seq_order[r] (longest chain first). Rows past the sequence end (next sequence or padding tail,
loaded whole by TMA) are kept out by selects, never by multiplying with zero, and K's padded rows are
zeroed before K^T Vr, so non-finite data there cannot leak in. The last sequence's block zero-fills o
on the padding tail after cu_seqlens[-1]. Chunk skip as in chunk_fwd.py.

Warp-group roles (384 threads = 3 warpgroups, split by thread index, one if/elif, no block-wide
barrier after the prologue; the producer's and the output warpgroup's steps, the state's load / store
and the padding tail are hopper/chunk_fwd_roles.py's macros, shared with chunk_fwd_wy.py):
  * WG0 producer (tx 0..127, set_max_nreg 40 dec): for chunk c into ring slot c % 2, waits
    empty[slot], issues T.tma_copy of K, V, Ag (one elected thread: expect_tx + loads on full[slot])
    and of Q, Pm (on full_o[slot], the output's only); threads 0..C-1 load gam (clamped g_cumsum,
    strided 4-byte elements: no TMA) into gam_s[slot]; all 128 arrive on full[slot] and full_o[slot].
  * WG1 state (tx 128..255, set_max_nreg 216 inc): owns S in fp32 registers. The only serial chain:
    S -> S_s[b] -> K S -> W -> Ag W -> Vd, Vr -> K^T Vr -> S.
  * WG2 output (tx 256..383, set_max_nreg 216 inc): Q S from S_s[b], h_out from S_s[b], Pm Vd from
    Vd_s[b], o stores; runs one chunk behind the state WG at most (b = c % 2 double-buffers S_s, Vd_s).
    A whole chunk's O goes out through the staging tile O_s and one TMA store (issued by one elected
    thread, bulk group waited (.read) before O_s is rewritten); the partial last chunk of a sequence
    is stored row by row (its tail rows belong to the next sequence). ncu at 1x32768 (session 7)
    showed the register-sourced stores (16-byte row pieces, 54% excess sectors) as the main
    long-scoreboard stall of the kernel: the next chunk's Q S wgmma waited for their registers.

Per-chunk stage order (slot = b = c % 2, ph = (c // 2) & 1; every mbarrier completes once per use of
its slot, so the phase to wait for is ph, and ph ^ 1 for "freed by the use two chunks ago", which a
fresh barrier passes at once):
  producer:  wait empty[slot] (ph ^ 1) -> TMA K, V, Ag (+ tx bytes on full[slot]), Q, Pm (on
             full_o[slot]) -> gam_s[slot] stores -> arrive full[slot], full_o[slot]
  state:     wait full[slot] (ph); wait o_free[b] (ph ^ 1: output WG done with S_s[b], Vd_s[b] of c - 2)
             S_s[b] = bf16(S); fence.proxy.async; bar.sync(1, 128); arrive s_ready[b]
             U = K S (wgmma); W_s = rows(V - e U); fence; bar.sync(1, 128)
             U = Ag W (wgmma) (= Vd); Vd_s[b] = rows(Vd), Vr_s = rows(r Vd);
             partial chunk: K_s[slot] rows past eos = 0; fence; bar.sync(1, 128); arrive vd_ready[b]
             S = exp(gam_C) S + K^T Vr (wgmma); arrive empty[slot]
  output:    wait full_o[slot] (ph); wait s_ready[b] (ph); O = Q S (wgmma); O *= scale e;
             store_h: h_out row from S_s[b]; wait vd_ready[b] (ph); O += Pm Vd (wgmma);
             arrive o_free[b]; arrive empty[slot]; whole chunk: wait the last TMA store's reads,
             bar.sync(2, 128), O_s = bf16(O), fence, bar.sync(2, 128), TMA store O_s -> o;
             partial chunk: o rows < eos -> global
  (W_s, Vd_s, Vr_s are formed in place on the state's dead accumulator and copied whole, by stmatrix, as
  in chunk_fwd_wy.py since session 13; this kernel, sm90's recurrence at BV = 32 only, passed the GPU suite
  with it but was not timed alone.)
Barriers (mbarrier arrive counts): full[2] = full_o[2] = 128 (producer threads; TMA bytes via expect_tx),
empty[2] = 256 (state + output threads), s_ready[2] = vd_ready[2] = 128 (state threads),
o_free[2] = 128 (output threads). Named barrier 1 (bar.sync 1, 128): the state WG's own smem writes
before its wgmma reads (3 per chunk); named barrier 2: the output WG's O_s (free, then written) around
its TMA store (2 per whole chunk). Thread-written smem read by wgmma is always fenced
(fence.proxy.async) by the writing threads before the barrier that publishes it.
TileLang's automatic shared-memory syncs are off (TL_DISABLE_THREAD_STORAGE_SYNC): every hazard is
covered by the barriers above (write-after-read on S_s / Vd_s by o_free, on W_s / Vr_s / K zeroing
by the next named barrier, which every state warp reaches only after its wgmma wait; on the ring by
empty), so the generated source has exactly one __syncthreads (after the mbarrier init) and the six
named barriers of the state WG. QLABENCH_WS_AUTO_SYNC=1 compiles with the automatic syncs back on
(TileLang then adds conservative 128-thread bar.syncs, ids 3 and 4, in the producer and state WGs):
the A/B to run first if results differ from chunk_fwd_pipelined.
The chunk loop runs in pairs (chunk 2 p + slot for slot = 0, 1, unrolled by macros) so every ring
buffer is indexed by a Python constant.

GEMMs per chunk (wgmma, smem operands, fp32 accumulate): state WG K S 64xBVx128, Ag W 64xBVx64,
K^T Vr 128xBVx64; output WG Q S 64xBVx128, Pm Vd 64xBVx64.

Shared memory, from the allocations (bf16 = 2 bytes; C = 64, K = 128):
    ring (2 slots): Q, K 2 x 2 x 16 KB, V 2 x C BV 2, Ag, Pm 2 x 2 x 8 KB, gam 2 x 256 B
    S_s 2 x K BV 2, Vd_s 2 x C BV 2, W_s, Vr_s, O_s C BV 2 each, 12 mbarriers
  BV = 64: 64 + 16 + 32 + 0.5 + 32 + 16 + 24 = 184.5 KB (+ barriers)
  BV = 32: 64 +  8 + 32 + 0.5 + 16 +  8 + 12 = 140.5 KB
  (``shared_memory_bytes``; tests/kernels/test_chunk_fwd_ws_compile.py checks it against the launch's
  dynamic shared memory in the generated host code, every buffer at its own offset (nothing
  overlapped); plus 2 KB static (cuobjdump SHARED:2048, the mbarriers). Under the 227 KB per block of
  the H200; one block per SM.)
Registers: S is K x BV fp32 = 64 (BV = 64) / 32 (BV = 32) registers per state thread; U (C x BV)
32 / 16; O in the output WG 32 / 16. The 384-thread launch (__launch_bounds__(384, 1)) gets 168 per
thread (cuobjdump -res-usage: REG:168, LOCAL:0, no spills at BV = 64); set_max_nreg quotas
40 (producer, dec) + 216 (state, inc) + 216 (output, inc) = 472 <= 3 x 168 = 504, so the two
increases (2 x 48 x 128) are covered by the producer's release (128 x 128).
"""

import functools

import tilelang.language as T
from tilelang import PassConfigKey

from ..common.build import compile_for
from ..common.chunk_fwd import value_rows
from .chunk_fwd_roles import roles

THREADS = 384  # producer, state, output warpgroups
NREG_PRODUCER = 40
NREG_STATE = 216
NREG_OUTPUT = 216
BAR_STATE = 1  # named barrier id of the state warpgroup's internal syncs (0 is __syncthreads)


def chunk_fwd_ws_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str,
                        state_v_first: bool, arch: str):
    """Compiled warp-specialized forward recurrence for one head configuration (runtime arguments
    as chunk_fwd.chunk_fwd_kernel). QLABENCH_WS_AUTO_SYNC=1 keeps TileLang's automatic
    shared-memory syncs on top of the explicit ones (a race-debugging A/B, see the header)."""
    import os

    auto_sync = os.environ.get("QLABENCH_WS_AUTO_SYNC", "0") == "1"
    return _chunk_fwd_ws(h_qk, h_v, K, V, BV, C, dtype, state_v_first, arch, auto_sync)


def shared_memory_bytes(K: int, BV: int, C: int = 64, elem: int = 2) -> int:
    """Dynamic shared memory of the kernel, from its allocations (the mbarriers are static)."""
    ring = 2 * (2 * C * K + C * BV + 2 * C * C) * elem + 2 * C * 4  # Q, K, V, Ag, Pm, gam per slot
    handoff = 2 * (K * BV + C * BV) * elem  # S_s, Vd_s per parity
    scratch = 2 * C * BV * elem  # W_s, Vr_s
    o_stage = C * BV * elem  # O_s, the output warpgroup's TMA-store staging tile
    return ring + handoff + scratch + o_stage


@functools.cache
def _chunk_fwd_ws(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str, state_v_first: bool,
                  arch: str, auto_sync: bool):
    if C != 64:
        raise ValueError(f"chunk_fwd_ws is written for C = 64 (one m64 wgmma per row block), got {C}")
    group = h_v // h_qk
    NV = V // BV
    n_tok = T.dynamic("n_tok")
    n_cu = T.dynamic("n_cu")
    n_h0 = T.dynamic("n_h0")
    n_ht = T.dynamic("n_ht")
    n_hc = T.dynamic("n_hc")
    n_skip = T.dynamic("n_skip")
    n_ord = T.dynamic("n_ord")
    state_shape = (h_v, V, K) if state_v_first else (h_v, K, V)

    R = roles(C, K, BV, dtype, state_v_first)  # the shared macros (hopper/chunk_fwd_roles.py)

    @T.macro
    def state_step(slot: int, c, n_run, bos, eos, skip, K_s, V_s, Ag_s, gam_s, S_s, Vd_s, W_s, Vr_s,
                   S_f, U_f, full, empty, s_ready, vd_ready, o_free, has_h0):
        if c < n_run:
            ph = (c // 2) & 1
            t0 = bos + (skip + c) * C
            T.mbarrier_wait_parity(full[slot], ph)
            T.mbarrier_wait_parity(o_free[slot], ph ^ 1)
            T.copy(S_f, S_s)
            T.fence_proxy_async()
            T.sync_threads(BAR_STATE, 128)
            T.mbarrier_arrive(s_ready[slot])

            T.gemm(K_s, S_s, U_f, clear_accum=True)
            # each C x BV tile formed in place on the (then dead) accumulator and copied whole (stmatrix),
            # not as element-wise 2-byte stores from the fragment layout
            for i, j in T.Parallel(C, BV):
                U_f[i, j] = T.if_then_else(t0 + i < eos, value_rows(V_s, has_h0, i, j) - T.exp(gam_s[i]) * U_f[i, j],
                                           0.0)
            T.copy(U_f, W_s)
            T.fence_proxy_async()
            T.sync_threads(BAR_STATE, 128)

            T.gemm(Ag_s, W_s, U_f, clear_accum=True)  # U_f now holds Vd
            R.handoff_vd(U_f, gam_s, Vd_s, Vr_s, t0, eos)
            if t0 + C > eos:
                for i, d in T.Parallel(C, K):
                    if t0 + i >= eos:
                        K_s[i, d] = T.cast(0, dtype)
            T.fence_proxy_async()
            T.sync_threads(BAR_STATE, 128)
            T.mbarrier_arrive(vd_ready[slot])

            for i, j in T.Parallel(K, BV):
                S_f[i, j] = S_f[i, j] * T.exp(gam_s[C - 1])
            T.gemm(K_s, Vr_s, S_f, transpose_A=True)
            T.mbarrier_arrive(empty[slot])

    def chunk_fwd_ws(
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
            # input ring, slot 0 and slot 1
            Q0 = T.alloc_shared((C, K), dtype)
            Q1 = T.alloc_shared((C, K), dtype)
            K0 = T.alloc_shared((C, K), dtype)
            K1 = T.alloc_shared((C, K), dtype)
            V0 = T.alloc_shared((C, BV), dtype)
            V1 = T.alloc_shared((C, BV), dtype)
            A0 = T.alloc_shared((C, C), dtype)
            A1 = T.alloc_shared((C, C), dtype)
            P0 = T.alloc_shared((C, C), dtype)
            P1 = T.alloc_shared((C, C), dtype)
            G0 = T.alloc_shared((C,), "float32")
            G1 = T.alloc_shared((C,), "float32")
            # state -> output hand-off, double-buffered by chunk parity
            S0 = T.alloc_shared((K, BV), dtype)
            S1 = T.alloc_shared((K, BV), dtype)
            D0 = T.alloc_shared((C, BV), dtype)
            D1 = T.alloc_shared((C, BV), dtype)
            # state warpgroup scratch
            W_s = T.alloc_shared((C, BV), dtype)
            Vr_s = T.alloc_shared((C, BV), dtype)
            # output warpgroup: O of a whole chunk on its way to the TMA store
            O_s = T.alloc_shared((C, BV), dtype)
            full = T.alloc_barrier([128, 128])
            full_o = T.alloc_barrier([128, 128])  # Q, Pm (the output's), apart from the chain's K, V, Ag
            empty = T.alloc_barrier([256, 256])
            s_ready = T.alloc_barrier([128, 128])
            vd_ready = T.alloc_barrier([128, 128])
            o_free = T.alloc_barrier([128, 128])
            S_f = T.alloc_fragment((K, BV), "float32")
            U_f = T.alloc_fragment((C, BV), "float32")
            O_f = T.alloc_fragment((C, BV), "float32")

            tx = T.get_thread_binding()
            ring0, ring1 = (Q0, K0, V0, A0, P0, G0), (Q1, K1, V1, A1, P1, G1)
            n, h, hk, v0, bos, eos, skip, n_run, n_pairs = R.block_run(cu_seqlens, seq_order, chunk_skip, has_skip,
                                                                       iv, nh, h_v, group)

            if tx < 128:
                T.set_max_nreg(NREG_PRODUCER, 0)
                R.producer_role(n_pairs, n_run, bos, eos, skip, h, hk, v0, tx, q, k, v, g_cumsum, Ag, Pm, ring0,
                                ring1, full, full_o, empty)
            elif tx < 256:
                T.set_max_nreg(NREG_STATE, 1)
                R.load_state(S_f, h0, has_h0, n, h, v0)
                for p in T.serial(n_pairs):
                    state_step(0, 2 * p, n_run, bos, eos, skip, K0, V0, A0, G0, S0, D0, W_s, Vr_s,
                               S_f, U_f, full, empty, s_ready, vd_ready, o_free, has_h0)
                    state_step(1, 2 * p + 1, n_run, bos, eos, skip, K1, V1, A1, G1, S1, D1, W_s, Vr_s,
                               S_f, U_f, full, empty, s_ready, vd_ready, o_free, has_h0)
                if store_final != 0:
                    R.store_state(S_f, ht, n, h, v0)
            else:
                T.set_max_nreg(NREG_OUTPUT, 1)
                R.output_role(n_pairs, n_run, bos, eos, skip, n, n_cu, n_tok, h, v0, scale, store_h, chunk_offsets,
                              h_out, o, ring0, ring1, (S0, D0), (S1, D1), O_f, O_s, full_o, empty, s_ready,
                              vd_ready, o_free)

    configs = {} if auto_sync else {PassConfigKey.TL_DISABLE_THREAD_STORAGE_SYNC: True}
    return compile_for(T.prim_func(chunk_fwd_ws), arch, configs)
