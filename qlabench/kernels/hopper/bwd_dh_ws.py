"""bwd_dh_ws: the backward's reverse state-gradient recurrence, manually warp-specialized (Hopper, sm_90a).

sm90's default reverse pass (KernelOptions.bwd_dh = "auto" or "ws"; "pipelined" takes bwd_dh_pipelined.py;
backward._dh_role).
tests/kernels/test_bwd_dh_ws_compile.py is its GPU A/B against bwd_dh_pipelined (dh, dV', dh0);
its H200 runs and timings (against bwd_dh_pipelined) are in results/h200/NOTES.md.

Same signature, grid and outputs as bwd_dh_pipelined.py, so the host can swap one for the other:
(q, k, do, Pg, Ag, fac, cu_seqlens, chunk_offsets, seq_order, chunk_skip, dht, dh_out, dvp_out, dh0_out, scale,
has_skip); with has_skip a block runs only its sequence's first m - chunk_skip[n, h] chunks, from dht at
the end of the last of them (common/bwd_h.reverse_run: backward_cp's truncated local pass), and stores
no dh, dV' rows, only dh0 (the local and transition passes read nothing else; their row outputs are
scratch that the final pass writes: the aux warpgroup still waits and arrives as below, it skips the stores);
grid (V / BV, N * H_v), one block per (sequence, v-head, V tile); BV = 32 or 64, C = 64, K = 128.

Formula per chunk, last chunk first (as bwd_dh_pipelined.py; dS = gradient of the state at the chunk
END, K x BV fp32, starting from dht; Pg, Ag bf16 from bwd_prepare; fac rows e = exp(gam),
r = exp(gam_C - gam), beta; e[C - 1] = exp(gam_C)):

    dh[c] = dS
    dV'   = diag(r) K dS + Pg^T dO           (stored for bwd_chunk; rows >= eos are 0 in smem, not stored)
    dU    = -diag(e) Ag^T dV'                (dv = Ag^T dV' itself is formed and stored by bwd_chunk)
    dS    = exp(gam_C) dS + K^T dU + Q^T (scale diag(e) dO)
    after the first chunk: dh0 = dS (always written)

The rounding points are those of bwd_dh_pipelined / emulate_bwd._emu_dh: dS -> bf16 (dh and the
K dS operand), dV' = r * (K dS) + Pg^T dO in fp32 then bf16, dU bf16 from the fp32 Ag^T dV',
eDO bf16; only the fp32 summation order of dV' differs (Pg^T dO is a separate fp32 product added
elementwise instead of accumulated into the K dS accumulator).

Partial chunk (the sequence's last chunk, processed first, cr == 0): the TMA loads the whole
[t0, t0 + C) (the next sequence or the padding tail past eos; rows past n_tok are zero-filled by the
TMA); the aux WG zeroes the rows past eos of Q, K, dO, Pg, Ag in the ring slot (plain stores after
waiting full[slot]; fenced) before any product reads them, and dV', eDO are selects on t0 + i < eos,
so non-finite data past the end cannot leak in (no multiply by zero). Only rows < eos of dV'
are stored. Sequences with no tokens run no chunk and write dh0 = dht.

Warp-group roles (384 threads = 3 warpgroups, split by thread index, one if/elif/else, no block-wide
barrier after the prologue), the chunk loop in pairs (cr = 2 p + slot, slot = 0, 1 unrolled by
macros) so every ring / hand-off buffer is indexed by a Python constant; c = n_chunks - 1 - cr:
  * WG0 producer (tx 0..127, set_max_nreg 40 dec): for chunk cr into ring slot cr % 2: wait
    empty[slot]; T.tma_copy of K, Ag, fac row (3 x C fp32), Pg, dO tile, Q on full[slot] (one elected
    thread: expect_tx + loads); all 128 arrive on full[slot]. Runs up to two chunks ahead.
  * WG1 state (tx 128..255, set_max_nreg 232 inc): owns dS (K x BV fp32 registers). The serial chain:
    dS -> dS_s[b] -> K dS -> dV' -> Ag^T dV' -> dU -> K^T dU (+ Q^T eDO) -> dS.
  * WG2 aux (tx 256..383, set_max_nreg 232 inc): everything off the chain: partial-chunk zeroing,
    eDO = scale diag(e) dO (bf16, E_s[b]), PgTdO = Pg^T dO (wgmma, fp32 registers, handed over in a
    padded fp32 tile PT_s), the dh store (from dS_s[b], which the state WG writes anyway as its K dS
    operand), the dV' row stores (from dVp_s[b]). Runs at most one chunk ahead of the
    state WG (PT_s is single-buffered), and its stores of chunk cr trail the state WG.
  (Departures from the first design: rK = diag(r) K in smem was dropped: a double-buffered 16 KB
  rK tile does not fit next to everything else at BV = 64 (+32 KB: 251.5 KB), and the r scaling on
  the K dS accumulator is 16 / 32 FMULs per thread, keeping the pipelined kernel's rounding. Q^T eDO
  stays on the state WG: handing a K x BV fp32 product over needs another 32 KB at BV = 64. Pg^T dO
  moved to the aux WG and is handed over in fp32 (not accumulated as a second wgmma into the K dS
  accumulator, which would have to wait for the r scaling, i.e. stay on the chain).)

Per-chunk stage order (b = slot = cr % 2, ph = (cr // 2) & 1; every per-slot mbarrier completes once
per use of its slot, so the phase to wait for is ph, and ph ^ 1 for "freed by the use two chunks
ago", which a fresh barrier passes at once; pt_ready / pt_free are single barriers completing once
per chunk: parity cr & 1, and (cr & 1) ^ 1 for "freed by chunk cr - 1"):
  producer:  wait empty[b] (ph ^ 1) -> TMA K, Ag, fac, Pg, dO, Q (+ tx bytes on full[b]) -> arrive full[b]
  state:     wait full[b] (ph); wait h_free[b] (ph ^ 1: aux done with dS_s[b], dVp_s[b] of cr - 2)
             dS_s[b] = bf16(dS); fence.proxy.async; bar.sync(1, 128); arrive s_ready[b]
             wait aux_ready[b] (ph: zeroed rows, E_s[b]); dVp = K dS_s[b] (wgmma)
             wait pt_ready (cr & 1); dVp_s[b] = rows(bf16(r dVp + PT_s)); arrive pt_free;
             fence; bar.sync(1, 128)
             dW = Ag^T dVp_s[b] (wgmma); dU_s = bf16(-e dW); fence; bar.sync(1, 128);
             arrive v_ready[b]
             dS = e[C-1] dS; dS += K^T dU_s (wgmma); dS += Q^T E_s[b] (wgmma); arrive empty[b]
  aux:       wait full[b] (ph); cr == 0 partial: zero rows >= eos of Q, K, dO, Pg, Ag in slot b;
             PT_f = rows(scale e dO); E_s[b] = bf16(PT_f); fence; bar.sync(2, 128); arrive aux_ready[b]
             PT = Pg^T dO (wgmma); arrive empty[b]
             wait pt_free ((cr & 1) ^ 1); PT_s = PT; arrive pt_ready
             wait s_ready[b] (ph); dh[c] rows <- dS_s[b]
             wait v_ready[b] (ph); dV' rows < eos <- dVp_s[b]; arrive h_free[b]
Barriers (mbarrier arrive counts): full[2] = 128 (producer threads; TMA bytes via expect_tx),
empty[2] = 256 (state + aux threads), aux_ready[2] = 128 (aux), s_ready[2] = v_ready[2] = 128
(state), h_free[2] = 128 (aux), pt_ready[1] = 128 (aux), pt_free[1] = 128 (state). Named barriers:
1 (bar.sync 1, 128), the state WG's own smem writes before its wgmma reads (3 per chunk); 2 (bar.sync
2, 128), the aux WG's zeroed ring rows before its own Pg^T dO (1 per chunk). Thread-written smem
read by wgmma (dS_s, dVp_s, dU_s by the state WG; E_s and the zeroed ring rows by the aux WG) is
fenced (fence.proxy.async) by the writing threads before the barrier that publishes it; PT_s, dS_s,
dVp_s read by plain loads need only the mbarrier's release / acquire.

Deadlock freedom (every wait has its arrive count in the phase it waits for, and no arrive depends
on a later wait of the waiter): producer(cr) needs empty(cr - 2): state and aux arrive it at the end
of / mid cr - 2 without waiting on the producer beyond full(cr - 2). state(cr) needs full(cr)
(producer), h_free(cr - 2) (aux finished cr - 2, which needed s_ready / v_ready of cr - 2, already
arrived), aux_ready(cr) (aux(cr) needs only full(cr) and, before that, its own chunk cr - 1, which
needs s_ready / v_ready(cr - 1), pt_free(cr - 2): all arrived by state before it reached cr),
pt_ready(cr) (aux(cr) after pt_free(cr - 1), arrived by state in cr - 1). aux(cr) needs full(cr),
pt_free(cr - 1), s_ready(cr), v_ready(cr): state reaches those arrives after waiting only on
aux_ready(cr) / pt_ready(cr), which aux arrives before its s_ready wait. No barrier can run two
phases ahead of a waiter (parity waits are unambiguous): the next completion of every barrier needs
an arrive that follows, in program order, the waiter's own wait on it or on a barrier that
completes after it (full(cr + 2) needs empty(cr), which state / aux arrive after waiting full(cr);
aux_ready(cr + 2) needs full(cr + 2); s_ready / v_ready(cr + 2) need h_free(cr), arrived after the
aux waited v_ready(cr); h_free(cr) needs v_ready(cr), arrived after the state waited h_free(cr - 2);
pt_ready(cr + 1) needs pt_free(cr), arrived after the state waited pt_ready(cr); pt_free(cr) needs
pt_ready(cr), arrived after the aux waited pt_free(cr - 1)).

Write-after-read hazards without a dedicated barrier: dU_s (single) is rewritten in chunk cr only
after two bar.sync(1) of chunk cr, which every state warp reaches after its wgmma wait of K^T dU of
cr - 1; E_s[b] (aux writes at cr + 2, state wgmma reads at cr) and the ring slot (TMA at cr + 2) are
ordered by empty(cr) -> producer -> full(cr + 2) (arrive release / wait acquire, transitive; the same
argument chunk_fwd_ws relies on for its ring); the aux's zeroing stores happen only at cr == 0 on a
slot with no earlier reader. TileLang's automatic shared-memory syncs are off
(TL_DISABLE_THREAD_STORAGE_SYNC): the generated source has exactly one __syncthreads (after the
mbarrier init) and the 8 named barriers above (6 of id 1, 2 of id 2, over the unrolled pair).
QLABENCH_WS_AUTO_SYNC=1 compiles with the automatic syncs back on: the A/B to run first if results
differ from bwd_dh_pipelined or a run hangs.

GEMMs per chunk (wgmma, smem operands, fp32 accumulate): state WG K dS 64xBVx128, Ag^T dV' 64xBVx64,
K^T dU 128xBVx64, Q^T eDO 128xBVx64 (all on the chain, as in bwd_dh_pipelined but issued by one
warpgroup, N = BV); aux WG Pg^T dO 64xBVx64 (off the chain). Measured and not kept (session 16,
results/h200/2026-12-02_s16/dh-ab.txt): dS decayed right after its bf16 copy and Q^T eDO issued with K dS, left
in flight under the dV' step: 1117 -> 1095 us at hk16_hv64 1x32768, 475 -> 474 at hk16_hv16 (CP), 266 -> 265 at
hk2_hv8 (CP): under the 2% the A/B asked for. A GEMM less on the chain moved it by 2%: its time is
elsewhere (per block and chunk at BV 64 it moved ~57 KB in and ~32 KB of dh, dV', dv out; dv has since moved
to bwd_chunk).

Shared memory, from the allocations (bf16 = 2 bytes; C = 64, K = 128):
    ring (2 slots): Q, K 2 x 2 x 16 KB, dO 2 x C BV 2, Pg, Ag 2 x 2 x 8 KB, fac 2 x 768 B
    state -> aux: dS_s 2 x K BV 2, dVp_s 2 x C BV 2;  aux -> state: E_s 2 x C BV 2,
    PT_s C (BV + 8) 4 (fp32, rows padded by 8 floats: the accumulator layout's 8 rows x 4 column
    pairs of one access fall in distinct banks);  state scratch: dU_s C BV 2
  BV = 64: 64 + 16 + 32 + 1.5 + 32 + 16 + 16 + 18 + 8 = 203.5 KB = 208,384 B
  BV = 32: 64 +  8 + 32 + 1.5 + 16 +  8 +  8 + 10 + 4 = 151.5 KB = 155,136 B
  (``shared_memory_bytes``; the compile test checks it against the launch's dynamic shared memory
  in the generated host code; as compiled every buffer has its own offset, nothing overlapped; plus
  2 KB static (cuobjdump SHARED:2048, the mbarriers): 210,432 B at BV = 64, under the 232,448 B
  (227 KB) one block may opt into on the H200; one block per SM.)
Registers: dS is K x BV fp32 = 64 (BV = 64) / 32 (BV = 32) per state thread, plus dVp, dW
(32 / 16 each; dW = Ag^T dV' only feeds dU); the aux WG's PT 32 / 16. The 384-thread launch (__launch_bounds__(384, 1)) gets 168
per thread; set_max_nreg quotas 40 (producer, dec) + 232 (state, inc) + 232 (aux, inc) = 504
<= 3 x 168 = 504: the two increases (2 x 64 x 128) are exactly the producer's release (128 x 128).

Verified on the CPU only (sm_90a, TileLang 0.1.15, nvcc 13.0): compiles at (H_qk, H_v) = (16, 16),
(2, 4), (4, 8) x BV = 32, 64 (bf16); ptxas -v / cuobjdump -res-usage: 168 registers, 0 bytes
spill stores / loads, LOCAL:0, 3 named barriers (0, 1, 2); the generated CUDA has the barrier
counts, parities, fences, setmaxnreg and the single __syncthreads listed above.

The state warpgroup's tiles (dV', dU; until session 26 also dv) are formed in place on its dead accumulators and
copied to shared memory whole (stmatrix; session 13's dv tile, read row-wise by the aux role, was swizzled):
bwd_dh_ws in the API's backward 568 -> 477 us at hk16_hv16 1x32768, 1425 -> 1114 at hk16_hv64. (The same
change to bwd_h_ws's Y tile measured slower then, 264 -> 289 and 998 -> 1098 us; with V read into registers
under the K S wgmma it is bwd_h_ws's Y since session 32.) The aux warpgroup's eDO is formed in PT_f and copied
whole (session 32): one loop reading dO_s and writing E_s does not batch its loads (docs/development.md).
"""

import functools
import os

import tilelang.language as T
from tilelang import PassConfigKey

from ..common.build import compile_for
from ..common.bwd_h import reverse_run, sequence_block
from ..common.smem_layout import swizzled

THREADS = 384  # producer, state, aux warpgroups
NREG_PRODUCER = 40
NREG_STATE = 232
NREG_AUX = 232
BAR_STATE = 1  # named barrier of the state warpgroup's internal syncs (0 is __syncthreads)
BAR_AUX = 2  # named barrier of the aux warpgroup's internal syncs
PT_PAD = 8  # fp32 columns of row padding of the Pg^T dO hand-off tile (bank-conflict-free rows)


def bwd_dh_ws_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str, arch: str):
    """Compiled warp-specialized reverse state-gradient pass for one head configuration (runtime
    arguments as bwd_dh_pipelined.bwd_dh_pipelined_kernel). QLABENCH_WS_AUTO_SYNC=1 keeps TileLang's
    automatic shared-memory syncs on top of the explicit ones (a race-debugging A/B, see the header)."""
    auto_sync = os.environ.get("QLABENCH_WS_AUTO_SYNC", "0") == "1"
    return _bwd_dh_ws(h_qk, h_v, K, V, BV, C, dtype, arch, auto_sync)


def shared_memory_bytes(K: int, BV: int, C: int = 64, elem: int = 2) -> int:
    """Dynamic shared memory of the kernel, from its allocations (the mbarriers are static)."""
    ring = 2 * (2 * C * K + C * BV + 2 * C * C) * elem + 2 * 3 * C * 4  # Q, K, dO, Pg, Ag, fac per slot
    handoff = 2 * (K * BV + C * BV) * elem  # dS_s, dVp_s per parity (state -> aux)
    edo = 2 * C * BV * elem  # eDO per parity (aux -> state)
    pt = C * (BV + PT_PAD) * 4  # Pg^T dO, fp32, one buffer (aux -> state)
    zn = C * K * elem  # Zn = -Ag diag(e) K, one buffer (aux -> state)
    return ring + handoff + edo + pt + zn


@functools.cache
def _bwd_dh_ws(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str, arch: str, auto_sync: bool):
    if C != 64:
        raise ValueError(f"bwd_dh_ws is written for C = 64 (one m64 wgmma per row block), got {C}")
    group = h_v // h_qk
    NV = V // BV
    n_tok = T.dynamic("n_tok")
    n_cu = T.dynamic("n_cu")
    n_ord = T.dynamic("n_ord")
    n_seq = T.dynamic("n_seq")
    n_hc = T.dynamic("n_hc")
    n_fc = T.dynamic("n_fc")
    n_skip = T.dynamic("n_skip")

    @T.macro
    def produce(slot: int, cr, n_chunks, bos, cbase, h, hk, v0, q, k, do, Pg, Ag, fac,
                Q_s, K_s, dO_s, Pg_s, Ag_s, F_s, full, empty):
        if cr < n_chunks:
            T.mbarrier_wait_parity(empty[slot], ((cr // 2) & 1) ^ 1)
            c = n_chunks - 1 - cr
            t0 = bos + c * C
            T.tma_copy(k[t0:t0 + C, hk, :], K_s, barrier=full[slot])
            T.tma_copy(Ag[t0:t0 + C, h, :], Ag_s, barrier=full[slot])
            T.tma_copy(fac[cbase + c, h, :, :], F_s, barrier=full[slot])
            T.tma_copy(Pg[t0:t0 + C, h, :], Pg_s, barrier=full[slot])
            T.tma_copy(do[t0:t0 + C, h, v0:v0 + BV], dO_s, barrier=full[slot])
            T.tma_copy(q[t0:t0 + C, hk, :], Q_s, barrier=full[slot])
            T.mbarrier_arrive(full[slot])

    @T.macro
    def state_step(slot: int, cr, n_chunks, bos, eos, Q_s, K_s, F_s, E_s, dS_s, dVp_s, PT_s, Zn_s, dS_f, dVp_f,
                   full, empty, aux_ready, s_ready, v_ready, h_free, pt_ready, pt_free, z_ready, z_free):
        if cr < n_chunks:
            ph = (cr // 2) & 1
            c = n_chunks - 1 - cr
            t0 = bos + c * C
            T.mbarrier_wait_parity(full[slot], ph)
            T.mbarrier_wait_parity(h_free[slot], ph ^ 1)
            T.copy(dS_f, dS_s)
            T.fence_proxy_async()
            T.sync_threads(BAR_STATE, 128)
            T.mbarrier_arrive(s_ready[slot])

            # K dS in flight while dS decays and Q^T eDO (off the chain) is issued behind it
            T.wgmma_gemm(K_s, dS_s, dVp_f, clear_accum=True)
            for i, j in T.Parallel(K, BV):
                dS_f[i, j] = dS_f[i, j] * F_s[0, C - 1]
            T.mbarrier_wait_parity(aux_ready[slot], ph)
            T.wgmma_gemm(Q_s, E_s, dS_f, transpose_A=True)
            T.wait_wgmma(1)
            T.mbarrier_wait_parity(pt_ready[0], cr & 1)
            # dV' formed in place on its (then dead) accumulator and copied whole (stmatrix)
            for i, j in T.Parallel(C, BV):
                dVp_f[i, j] = T.if_then_else(t0 + i < eos, dVp_f[i, j] * F_s[1, i] + PT_s[i, j], 0.0)
            T.copy(dVp_f, dVp_s)
            T.mbarrier_arrive(pt_free[0])
            T.fence_proxy_async()
            T.sync_threads(BAR_STATE, 128)
            T.mbarrier_arrive(v_ready[slot])

            T.mbarrier_wait_parity(z_ready[0], cr & 1)
            T.gemm(Zn_s, dVp_s, dS_f, transpose_A=True)  # K^T dU = Zn^T dV'
            T.mbarrier_arrive(z_free[0])
            T.mbarrier_arrive(empty[slot])

    @T.macro
    def aux_step(slot: int, cr, n_chunks, bos, eos, cbase, h, v0, scale, has_skip, dh_out, dvp_out,
                 Q_s, K_s, dO_s, Pg_s, Ag_s, F_s, E_s, dS_s, dVp_s, PT_s, Zn_s, PT_f, Zn_f, Ag_f,
                 full, empty, aux_ready, s_ready, v_ready, h_free, pt_ready, pt_free, z_ready, z_free):
        if cr < n_chunks:
            ph = (cr // 2) & 1
            c = n_chunks - 1 - cr
            t0 = bos + c * C
            T.mbarrier_wait_parity(full[slot], ph)
            if t0 + C > eos:  # the sequence's partial last chunk (cr == 0): rows past its end = 0
                for i, d in T.Parallel(C, K):
                    if t0 + i >= eos:
                        Q_s[i, d] = T.cast(0, dtype)
                        K_s[i, d] = T.cast(0, dtype)
                for i, j in T.Parallel(C, BV):
                    if t0 + i >= eos:
                        dO_s[i, j] = T.cast(0, dtype)
                for i, j in T.Parallel(C, C):
                    if t0 + i >= eos:
                        Pg_s[i, j] = T.cast(0, dtype)
                        Ag_s[i, j] = T.cast(0, dtype)
            # formed in PT_f (free until Pg^T dO below), then copied whole: one loop reading dO_s and writing E_s is
            # serialised by their possible aliasing (bwd_h_ws's Y, H200 session 32); a select too: no ordering on the
            # zeroing above needed
            for i, j in T.Parallel(C, BV):
                PT_f[i, j] = T.if_then_else(t0 + i < eos, scale * F_s[0, i] * dO_s[i, j], 0.0)
            T.copy(PT_f, E_s)
            T.fence_proxy_async()
            T.sync_threads(BAR_AUX, 128)
            T.mbarrier_arrive(aux_ready[slot])

            T.gemm(Pg_s, dO_s, PT_f, transpose_A=True, clear_accum=True)
            T.mbarrier_wait_parity(pt_free[0], (cr & 1) ^ 1)
            for i, j in T.Parallel(C, BV):
                PT_s[i, j] = PT_f[i, j]
            T.mbarrier_arrive(pt_ready[0])

            # Zn = -Ag diag(e) K (Ag diag(e) formed in registers: the wgmma's A operand; rows and columns past the
            # end a select)
            T.copy(Ag_s, Ag_f)
            for i, j in T.Parallel(C, C):
                Ag_f[i, j] = -Ag_f[i, j] * F_s[0, j]
            T.gemm(Ag_f, K_s, Zn_f, clear_accum=True)
            T.mbarrier_arrive(empty[slot])
            T.mbarrier_wait_parity(z_free[0], (cr & 1) ^ 1)
            T.copy(Zn_f, Zn_s)
            T.fence_proxy_async()
            T.sync_threads(BAR_AUX, 128)
            T.mbarrier_arrive(z_ready[0])

            T.mbarrier_wait_parity(s_ready[slot], ph)
            if has_skip == 0:  # the local and transition passes (has_skip) keep only dh0: no row stores
                for i, j in T.Parallel(K, BV):
                    dh_out[cbase + c, h, i, v0 + j] = dS_s[i, j]
            T.mbarrier_wait_parity(v_ready[slot], ph)
            if has_skip == 0:
                for i, j in T.Parallel(C, BV):
                    if t0 + i < eos:
                        dvp_out[t0 + i, h, v0 + j] = dVp_s[i, j]
            T.mbarrier_arrive(h_free[slot])

    def bwd_dh_ws(
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
        dh0_out: T.Tensor((n_seq, h_v, K, V), "float32"),
        scale: T.float32,
        has_skip: T.int32,
    ):
        with T.Kernel(NV, (n_cu - 1) * h_v, threads=THREADS) as (iv, nh):
            # input ring, slot 0 and slot 1
            Q0 = T.alloc_shared((C, K), dtype)
            Q1 = T.alloc_shared((C, K), dtype)
            K0 = T.alloc_shared((C, K), dtype)
            K1 = T.alloc_shared((C, K), dtype)
            O0 = T.alloc_shared((C, BV), dtype)
            O1 = T.alloc_shared((C, BV), dtype)
            P0 = T.alloc_shared((C, C), dtype)
            P1 = T.alloc_shared((C, C), dtype)
            A0 = T.alloc_shared((C, C), dtype)
            A1 = T.alloc_shared((C, C), dtype)
            F0 = T.alloc_shared((3, C), "float32")
            F1 = T.alloc_shared((3, C), "float32")
            # state -> aux hand-off (dh, dV' of the chunk), double-buffered by chunk parity
            S0 = T.alloc_shared((K, BV), dtype)
            S1 = T.alloc_shared((K, BV), dtype)
            Vp0 = T.alloc_shared((C, BV), dtype)
            Vp1 = T.alloc_shared((C, BV), dtype)
            # aux -> state: eDO by parity; Pg^T dO (fp32, padded rows) and Zn single
            E0 = T.alloc_shared((C, BV), dtype)
            E1 = T.alloc_shared((C, BV), dtype)
            PT_s = T.alloc_shared((C, BV + PT_PAD), "float32")
            Zn_s = T.alloc_shared((C, K), dtype)
            full = T.alloc_barrier([128, 128])
            empty = T.alloc_barrier([256, 256])
            aux_ready = T.alloc_barrier([128, 128])
            s_ready = T.alloc_barrier([128, 128])
            v_ready = T.alloc_barrier([128, 128])
            h_free = T.alloc_barrier([128, 128])
            pt_ready = T.alloc_barrier([128])
            pt_free = T.alloc_barrier([128])
            z_ready = T.alloc_barrier([128])
            z_free = T.alloc_barrier([128])
            dS_f = T.alloc_fragment((K, BV), "float32")
            dVp_f = T.alloc_fragment((C, BV), "float32")
            PT_f = T.alloc_fragment((C, BV), "float32")
            Zn_f = T.alloc_fragment((C, K), "float32")
            Ag_f = T.alloc_fragment((C, C), dtype)

            T.annotate_layout(swizzled(A0, A1))  # read in the wgmma A-operand register layout (conflict-free)
            tx = T.get_thread_binding()
            n, h, hk, v0, bos, eos, cbase = sequence_block(cu_seqlens, chunk_offsets, seq_order, iv, nh, h_v, group, BV)
            n_chunks = reverse_run(bos, eos, C, chunk_skip, has_skip, n, h)
            n_pairs = T.ceildiv(n_chunks, 2)

            if tx < 128:
                T.set_max_nreg(NREG_PRODUCER, 0)
                for p in T.serial(n_pairs):
                    produce(0, 2 * p, n_chunks, bos, cbase, h, hk, v0, q, k, do, Pg, Ag, fac,
                            Q0, K0, O0, P0, A0, F0, full, empty)
                    produce(1, 2 * p + 1, n_chunks, bos, cbase, h, hk, v0, q, k, do, Pg, Ag, fac,
                            Q1, K1, O1, P1, A1, F1, full, empty)
            elif tx < 256:
                T.set_max_nreg(NREG_STATE, 1)
                for i, j in T.Parallel(K, BV):
                    dS_f[i, j] = dht[n, h, i, v0 + j]
                for p in T.serial(n_pairs):
                    state_step(0, 2 * p, n_chunks, bos, eos, Q0, K0, F0, E0, S0, Vp0, PT_s, Zn_s, dS_f, dVp_f,
                               full, empty, aux_ready, s_ready, v_ready, h_free, pt_ready, pt_free, z_ready, z_free)
                    state_step(1, 2 * p + 1, n_chunks, bos, eos, Q1, K1, F1, E1, S1, Vp1, PT_s, Zn_s, dS_f, dVp_f,
                               full, empty, aux_ready, s_ready, v_ready, h_free, pt_ready, pt_free, z_ready, z_free)
                for i, j in T.Parallel(K, BV):
                    dh0_out[n, h, i, v0 + j] = dS_f[i, j]
            else:
                T.set_max_nreg(NREG_AUX, 1)
                for p in T.serial(n_pairs):
                    aux_step(0, 2 * p, n_chunks, bos, eos, cbase, h, v0, scale, has_skip, dh_out, dvp_out,
                             Q0, K0, O0, P0, A0, F0, E0, S0, Vp0, PT_s, Zn_s, PT_f, Zn_f, Ag_f,
                             full, empty, aux_ready, s_ready, v_ready, h_free, pt_ready, pt_free, z_ready, z_free)
                    aux_step(1, 2 * p + 1, n_chunks, bos, eos, cbase, h, v0, scale, has_skip, dh_out, dvp_out,
                             Q1, K1, O1, P1, A1, F1, E1, S1, Vp1, PT_s, Zn_s, PT_f, Zn_f, Ag_f,
                             full, empty, aux_ready, s_ready, v_ready, h_free, pt_ready, pt_free, z_ready, z_free)

    configs = {} if auto_sync else {PassConfigKey.TL_DISABLE_THREAD_STORAGE_SYNC: True}
    return compile_for(T.prim_func(bwd_dh_ws), arch, configs)
