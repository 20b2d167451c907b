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
scratch that the final pass writes: the producer still waits and arrives as below, it skips the stores);
grid (V / BV, N * H_v), one block per (sequence, v-head, V tile); BV = 32 or 64, C = 64, K = 128.

Formula per chunk, last chunk first (dS = gradient of the state at the chunk END, K x BV fp32, starting from
dht; Pg, Ag bf16 from bwd_prepare; fac rows e = exp(gam), r = exp(gam_C - gam), beta; e[C - 1] = exp(gam_C)):

    dh[c] = dS
    dV'   = diag(r) K dS + Pg^T dO           (stored for bwd_chunk; rows >= eos are 0 in smem, not stored)
    Zn    = -Ag diag(e) K                    (C x K, no state in it: formed off the chain)
    dS    = exp(gam_C) dS + Zn^T dV' + Q^T (scale diag(e) dO)
    after the first chunk: dh0 = dS (always written)

Zn^T dV' is bwd_dh_pipelined's K^T dU with dU = -diag(e) Ag^T dV' regrouped (K^T (-diag(e) Ag^T dV') =
(-Ag diag(e) K)^T dV'): the chain keeps two GEMMs (K dS, Zn^T dV'), the shape of bwd_h_ws's, in place of
three. Rounding (emulate_bwd._emu_dh with zn=True, sm90's twin): dS -> bf16 (dh and the K dS operand), dV' =
r * (K dS) + Pg^T dO in fp32 then bf16, -Ag diag(e) in bf16 (the Zn product's register A operand), Zn bf16,
eDO bf16. Against bwd_dh_pipelined (dU bf16) dh, dV' of the first chunk are equal; the later chunks and dh0
differ by the rounding of Zn in place of dU (~1e-3 relative).

Partial chunk (the sequence's last chunk, processed first, cr == 0): the TMA loads the whole
[t0, t0 + C) (the next sequence or the padding tail past eos; rows past n_tok are zero-filled by the
TMA); the aux WG zeroes the rows past eos of Q, K, dO, Pg, Ag in the ring slot (plain stores, then its
named barrier) before it or the state WG reads them, and dV' is a select on t0 + i < eos, so non-finite
data past the end cannot leak in (no multiply by zero: the zeroed rows are exact zeros, and in the rows
< eos Ag's columns past the end are exact zeros too, bwd_prepare's causal select, times finite e).
Only rows < eos of dV' are stored. Sequences with no tokens run no chunk and write dh0 = dht.

Warp-group roles (384 threads = 3 warpgroups, split by thread index, one if/elif/else, no block-wide
barrier after the prologue), the chunk loop in pairs (cr = 2 p + slot, slot = 0, 1 unrolled by
macros) so every ring / hand-off buffer is indexed by a Python constant; c = n_chunks - 1 - cr:
  * WG0 producer (tx 0..127, set_max_nreg 40 dec): for chunk cr into ring slot cr % 2: wait
    empty[slot]; T.tma_copy of K, Ag, fac row (3 x C fp32), Pg, dO tile, Q on full[slot] (one elected
    thread: expect_tx + loads); all 128 arrive on full[slot]. Then the row stores of chunk cr - 1 by TMA
    (one elected thread): dh from dS_s after s_ready, dV' from dVp_s after v_ready (the partial chunk's
    rows < eos by plain stores), wait for the TMA's reads (cp.async.bulk.wait_group.read 0), arrive
    h_free. Runs up to two chunks ahead with its loads.
  * WG1 state (tx 128..255, set_max_nreg 232 inc): owns dS (K x BV fp32 registers). The serial chain:
    dS -> dS_s[b] -> K dS -> dV' -> Zn^T dV' (+ Q^T eDO) -> dS.
  * WG2 aux (tx 256..383, set_max_nreg 232 inc): everything else: partial-chunk zeroing,
    eDO = scale diag(e) dO (dO read by ldmatrix, bf16, E_s[b]), PgTdO = Pg^T dO (wgmma, fp32 registers,
    handed over in a padded fp32 tile PT_s), Zn (Ag read by ldmatrix into the wgmma's A fragment, scaled
    there by -e per column; fp32 accumulator, bf16 into Zn_s). Runs at most one chunk ahead of the state
    WG (PT_s and Zn_s are single-buffered).
  (History: until session 33 the chain was K dS -> Ag^T dV' -> dU -> K^T dU, and the aux WG stored dh, dV'
  rows element-wise; session 33's v1-v3 (results/h200/2026-12-04_s33) measured the V-free forms slower
  alone, with the aux WG pacing the step (Age formed by an element loop: 1092 / 3290 cycles per chunk at
  BV 64 / 32, the eDO loop 928, the row stores 1050); this version moves both loops to ldmatrix and the
  stores to the producer's TMA. Q^T eDO stays on the state WG: handing a K x BV fp32 product over needs
  another 32 KB at BV = 64. rK = diag(r) K in smem does not fit.)

Per-chunk stage order (b = slot = cr % 2, ph = (cr // 2) & 1; every per-slot mbarrier completes once
per use of its slot, so the phase to wait for is ph, and ph ^ 1 for "freed by the use two chunks
ago", which a fresh barrier passes at once; pt_*, z_* are single barriers completing once per chunk:
parity cr & 1, and (cr & 1) ^ 1 for "freed by chunk cr - 1"):
  producer:  wait empty[b] (ph ^ 1) -> TMA K, Ag, fac, Pg, dO, Q (+ tx bytes on full[b]) -> arrive full[b];
             then for chunk cr - 1 (slot b' = 1 - b, its ph'): wait s_ready[b'] (ph'); TMA dh <- dS_s[b'];
             wait v_ready[b'] (ph'); TMA dV' <- dVp_s[b'] (partial: plain rows < eos); wait_group.read 0;
             arrive h_free[b']   (the loop runs n_chunks // 2 + 1 pairs so the last chunk's stores follow)
  state:     wait full[b] (ph); wait h_free[b] (ph ^ 1: the producer done with dS_s[b], dVp_s[b] of cr - 2)
             dS_s[b] = bf16(dS); fence.proxy.async; bar.sync(1, 128); arrive s_ready[b]
             dVp = K dS_s[b] (wgmma, async); dS = e[C-1] dS; wait aux_ready[b] (ph: zeroed rows, E_s[b]);
             dS += Q^T E_s[b] (wgmma, async); wait for K dS
             wait pt_ready (cr & 1); dVp_s[b] = bf16(select(r dVp + PT_s)); arrive pt_free;
             fence; bar.sync(1, 128); arrive v_ready[b]
             wait z_ready (cr & 1); dS += Zn_s^T dVp_s[b] (wgmma); arrive z_free; arrive empty[b]
  aux:       wait full[b] (ph); cr == 0 partial: zero rows >= eos of Q, K, dO, Pg, Ag in slot b, bar.sync(2);
             dO_f = ldmatrix(dO); PT_f = scale e dO_f; E_s[b] = bf16(PT_f); fence; bar.sync(2, 128);
             arrive aux_ready[b]
             PT = Pg^T dO (wgmma); wait pt_free ((cr & 1) ^ 1); PT_s = PT; arrive pt_ready
             Ag_f = ldmatrix(Ag); Ag_f = -Ag_f e (per column); Zn = Ag_f K (wgmma, A from registers);
             arrive empty[b]; wait z_free ((cr & 1) ^ 1); Zn_s = bf16(Zn); fence; bar.sync(2, 128);
             arrive z_ready
Barriers (mbarrier arrive counts): full[2] = 128 (producer threads; TMA bytes via expect_tx),
empty[2] = 256 (state + aux threads), aux_ready[2] = 128 (aux), s_ready[2] = v_ready[2] = 128
(state), h_free[2] = 128 (producer), pt_ready[1] = z_ready[1] = 128 (aux), pt_free[1] = z_free[1] = 128
(state). Named barriers: 1 (bar.sync 1, 128), the state WG's own smem writes before its wgmma or the
TMA reads them (2 per chunk); 2 (bar.sync 2, 128), the aux WG's (2 per chunk, plus 1 after the partial
chunk's zeroing). Thread-written smem read by wgmma or TMA (dS_s, dVp_s by the state WG; E_s, Zn_s and
the zeroed ring rows by the aux WG) is fenced (fence.proxy.async) by the writing threads before the
barrier that publishes it; PT_s read by plain loads needs only the mbarrier's release / acquire.

Deadlock freedom (every wait has its arrive count in the phase it waits for, and no arrive depends
on a later wait of the waiter): producer(cr) (loads) needs empty(cr - 2): state and aux arrive it at the
end of / mid cr - 2 without waiting on the producer beyond full(cr - 2) and h_free(cr - 4); producer
stores(cr - 1) need s_ready / v_ready(cr - 1): the state arrives them after full(cr - 1) and h_free(cr - 3)
(both arrived by the producer earlier in its program order) and aux_ready / pt_ready(cr - 1) (aux).
state(cr) needs full(cr), h_free(cr - 2) (producer stores(cr - 2), before its loads of cr + 1),
aux_ready(cr), pt_ready(cr), z_ready(cr): aux(cr) needs full(cr), pt_free(cr - 1) and z_free(cr - 1),
which the state arrived in cr - 1. aux(cr) needs nothing of the state's chunk cr. No barrier can run
two phases ahead of a waiter (parity waits are unambiguous): full(cr + 2) needs empty(cr); aux_ready
(cr + 2) needs full(cr + 2); s_ready / v_ready(cr + 2) need h_free(cr), arrived after the producer
waited v_ready(cr); h_free(cr + 2) needs v_ready(cr + 2), arrived after the state waited h_free(cr);
pt_ready(cr + 1) needs pt_free(cr), arrived after the state waited pt_ready(cr); pt_free(cr + 1)
needs pt_ready(cr + 1), arrived after the aux waited pt_free(cr); z_ready / z_free likewise.

Write-after-read hazards without a dedicated barrier: E_s[b] (aux writes at cr + 2, state wgmma reads at
cr) and the ring slot (TMA at cr + 2) are ordered by empty(cr) -> producer -> full(cr + 2) (arrive release
/ wait acquire, transitive); Zn_s by z_free, PT_s by pt_free; dS_s[b], dVp_s[b] by h_free (the TMA's
reads complete before it); the aux's zeroing stores happen only at cr == 0 on a slot with no earlier
reader. TileLang's automatic shared-memory syncs are off (TL_DISABLE_THREAD_STORAGE_SYNC): the generated
source has exactly one __syncthreads (after the mbarrier init) and the named barriers above.
QLABENCH_WS_AUTO_SYNC=1 compiles with the automatic syncs back on: the A/B to run first if results differ
from bwd_dh_pipelined or a run hangs.

GEMMs per chunk (wgmma, fp32 accumulate): state WG K dS 64xBVx128, Zn^T dV' 128xBVx64 (on the chain),
Q^T eDO 128xBVx64 (issued under K dS); aux WG Pg^T dO 64xBVx64, Zn = (-Ag diag(e)) K 64x128x64 (A from
registers).

Shared memory, from the allocations (bf16 = 2 bytes; C = 64, K = 128):
    ring (2 slots): Q, K 2 x 2 x 16 KB, dO 2 x C BV 2, Pg, Ag 2 x 2 x 8 KB, fac 2 x 768 B
    state -> producer: dS_s 2 x K BV 2, dVp_s 2 x C BV 2;  aux -> state: E_s 2 x C BV 2,
    PT_s C (BV + 8) 4 (fp32, rows padded by 8 floats: the accumulator layout's 8 rows x 4 column
    pairs of one access fall in distinct banks), Zn_s C K 2 (16 KB)
  BV = 64: 64 + 16 + 32 + 1.5 + 32 + 16 + 16 + 18 + 16 = 211.5 KB = 216,576 B
  BV = 32: 64 +  8 + 32 + 1.5 + 16 +  8 +  8 + 10 + 16 = 163.5 KB = 167,424 B
  (``shared_memory_bytes``; the compile test checks it against the launch's dynamic shared memory;
  plus the static mbarriers: under the 232,448 B (227 KB) one block may opt into on the H200; one block
  per SM. A second Zn buffer (+16 KB) would not fit at BV = 64.)
Registers: dS is K x BV fp32 = 64 (BV = 64) / 32 (BV = 32) per state thread, plus dVp (32 / 16); the
aux WG's PT (32 / 16), Zn (64), Ag_f (16), dO_f (16 / 8). The 384-thread launch (__launch_bounds__(384, 1))
gets 168 per thread; set_max_nreg quotas 40 (producer, dec) + 232 (state, inc) + 232 (aux, inc) = 504 <=
3 x 168 = 504. ptxas allocates the producer's code (TMA issue, the partial chunk's dV' rows) within its 40
(cuobjdump -sass: R0..R33 after USETMAXREG.DEALLOC 0x28, session 34).

Compiles with 0 bytes spill at (H_qk, H_v, BV) = (16, 64, 64), (16, 32, 64), (16, 16, 32), (2, 4, 32 / 64)
(sm_90a, TileLang 0.1.15, nvcc 13.0, session 34). H200, session 36 (results/h200/2026-12-05_s36): alone at T = 32768
(has_skip 0) 917 / 823 / 668 us against the previous chain's (f257d4d) 964 / 953 / 674 at (16, 64, 64) / (16, 32, 64) /
(16, 16, 32); h200-bwd phase bwd 0.991x (geomean over 40 rows, same call); the whole GPU suite passes at 3db3889.
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
    def store_rows(slot: int, cr, n_chunks, bos, eos, cbase, h, v0, has_skip, dh_out, dvp_out, dS_s, dVp_s,
                   s_ready, v_ready, h_free):
        if (cr >= 0) & (cr < n_chunks):
            ph = (cr // 2) & 1
            c = n_chunks - 1 - cr
            t0 = bos + c * C
            T.mbarrier_wait_parity(s_ready[slot], ph)
            if has_skip == 0:  # the local and transition passes (has_skip) keep only dh0: no row stores
                T.tma_copy(dS_s, dh_out[cbase + c, h, 0:K, v0:v0 + BV])
            T.mbarrier_wait_parity(v_ready[slot], ph)
            if has_skip == 0:
                if t0 + C <= eos:
                    T.tma_copy(dVp_s, dvp_out[t0:t0 + C, h, v0:v0 + BV])
                else:  # the partial chunk: rows < eos only (the next sequence's rows follow)
                    for i, j in T.Parallel(C, BV):
                        if t0 + i < eos:
                            dvp_out[t0 + i, h, v0 + j] = dVp_s[i, j]
                T.tma_store_wait(0)
            T.mbarrier_arrive(h_free[slot])

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
    def aux_step(slot: int, cr, n_chunks, bos, eos, scale, Q_s, K_s, dO_s, Pg_s, Ag_s, F_s, E_s, PT_s, Zn_s,
                 PT_f, Zn_f, Ag_f, dO_f, full, empty, aux_ready, pt_ready, pt_free, z_ready, z_free):
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
                T.sync_threads(BAR_AUX, 128)  # the zeroed rows before the ldmatrix reads below
            # dO read whole (ldmatrix), scaled by rows in PT_f's layout (free until Pg^T dO below), copied whole
            T.copy(dO_s, dO_f)
            for i, j in T.Parallel(C, BV):
                PT_f[i, j] = dO_f[i, j] * (scale * F_s[0, i])
            T.copy(PT_f, E_s)
            T.fence_proxy_async()
            T.sync_threads(BAR_AUX, 128)
            T.mbarrier_arrive(aux_ready[slot])

            T.gemm(Pg_s, dO_s, PT_f, transpose_A=True, clear_accum=True)
            T.mbarrier_wait_parity(pt_free[0], (cr & 1) ^ 1)
            for i, j in T.Parallel(C, BV):
                PT_s[i, j] = PT_f[i, j]
            T.mbarrier_arrive(pt_ready[0])

            # Zn = -Ag diag(e) K, -Ag diag(e) read by ldmatrix into the wgmma's A fragment and scaled there (no select:
            # the rows past the end are zeroed above, and Ag's columns past the end are exact zeros in the rows before)
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
            dO_f = T.alloc_fragment((C, BV), dtype)

            T.annotate_layout(swizzled(A0, A1))  # read in the wgmma A-operand register layout (conflict-free)
            tx = T.get_thread_binding()
            n, h, hk, v0, bos, eos, cbase = sequence_block(cu_seqlens, chunk_offsets, seq_order, iv, nh, h_v, group, BV)
            n_chunks = reverse_run(bos, eos, C, chunk_skip, has_skip, n, h)
            n_pairs = T.ceildiv(n_chunks, 2)

            if tx < 128:
                T.set_max_nreg(NREG_PRODUCER, 0)
                for p in T.serial(n_chunks // 2 + 1):  # loads of chunk cr, then the row stores of cr - 1
                    produce(0, 2 * p, n_chunks, bos, cbase, h, hk, v0, q, k, do, Pg, Ag, fac,
                            Q0, K0, O0, P0, A0, F0, full, empty)
                    store_rows(1, 2 * p - 1, n_chunks, bos, eos, cbase, h, v0, has_skip, dh_out, dvp_out, S1, Vp1,
                               s_ready, v_ready, h_free)
                    produce(1, 2 * p + 1, n_chunks, bos, cbase, h, hk, v0, q, k, do, Pg, Ag, fac,
                            Q1, K1, O1, P1, A1, F1, full, empty)
                    store_rows(0, 2 * p, n_chunks, bos, eos, cbase, h, v0, has_skip, dh_out, dvp_out, S0, Vp0,
                               s_ready, v_ready, h_free)
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
                    aux_step(0, 2 * p, n_chunks, bos, eos, scale, Q0, K0, O0, P0, A0, F0, E0,
                             PT_s, Zn_s, PT_f, Zn_f, Ag_f, dO_f, full, empty, aux_ready, pt_ready, pt_free, z_ready, z_free)
                    aux_step(1, 2 * p + 1, n_chunks, bos, eos, scale, Q1, K1, O1, P1, A1, F1, E1,
                             PT_s, Zn_s, PT_f, Zn_f, Ag_f, dO_f, full, empty, aux_ready, pt_ready, pt_free, z_ready, z_free)

    configs = {} if auto_sync else {PassConfigKey.TL_DISABLE_THREAD_STORAGE_SYNC: True}
    return compile_for(T.prim_func(bwd_dh_ws), arch, configs)
