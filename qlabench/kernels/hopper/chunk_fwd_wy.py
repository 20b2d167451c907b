r"""chunk_fwd_wy: chunk_fwd_ws with the WY form of the state chain (Hopper, sm_90a). sm90's default
recurrence at BV = 64 (forward.recurrence_role); chunk_fwd_ws stays the one at BV = 32.

Measured on the H200 (session 8, recurrence kernel alone, us, chunk_fwd_wy vs chunk_fwd_ws, bench gates,
h0): hk16_hv64 1x32768 (BV 64, 128 blocks) 1219 vs 1335: the state chain is one wgmma and one
shared-memory round trip shorter. At BV 32 the wu warpgroup is the slowest role (W costs the same at
either tile, and each of a chain's four V-tile blocks forms it): hk16_hv16 1x32768 918 vs 778, hk2_hv8
1x32768 898 vs 773, hk2_hv8 1x8192 225 vs 195. Errors against float64 unchanged (o 4.4e-3, ht 3.8e-3).

Per chunk (gam, e, r, Ag, Pm as chunk_fwd_ws.py):
    U  = Ag V                  (C x BV)       \  formed by a fourth warpgroup ("wu"), off the state chain,
    W  = Ag diag(e) K          (C x K)        /  bf16 in shared memory (W stored negated)
    Vd = U - W S                              one wgmma on the chain instead of K S, W, Ag W
    O  = scale diag(e) Q S + Pm Vd
    S  = exp(gam_C) S + K^T diag(r) Vd
(Vd = Ag (V - diag(e) K S) = Ag V - Ag diag(e) K S: the same value, other bf16 rounding points: U and W
are rounded to bf16 instead of V - e K S.)

Roles (512 threads): WG0 producer (TMA K, V, Ag on full[slot], Q, Pm on full_o[slot]; gam), WG1 state,
WG2 output (as chunk_fwd_ws), WG3 wu: wait full[slot]; partial chunk: zero K_s, V_s rows past eos;
Ag diag(-e) into registers (ldmatrix, scaled and rounded to bf16 there); U = Ag V (wgmma from shared) and
-W = (Ag diag(-e)) K (wgmma with A from registers) issued together, one wait; U -> V_s (bf16, in place),
-W -> W_s[slot]; fence; arrive wu_ready[slot]. The state waits wu_ready[slot] instead of full[slot]:
acc = U (from V_s), acc += W_s S_s (= Vd).
Register quotas 24 (producer) + 144 (wu) + 216 (state) + 128 (output) = 512 = 4 x 128.
Session 14 (H200, ncu stall samples per role at hk16_hv64 8192x4): the wu warpgroup was the chain's
bottleneck (waiting on mbarriers 7.5% of its samples, against 34% for the state and 36% for the output);
~40% of its time went to scaling Ag's columns by e in shared memory (an exp, a load and a store per
element, a fence and a barrier). On registers, with both products issued before one wait, the same
values come out (bf16(-Ag e) = -bf16(Ag e)), and the wu then waited 42% of its samples, on full[slot]:
the ring's loads. Splitting the output's Q, Pm onto full_o[slot] lets the chain start on 32 of the
slot's 56 KB. Kernel time in the API's forward (us): hk16_hv64 1x32768 1073 -> 947 (registers) -> 909
(full_o), hk16_hv64 8192x4 1078 -> 923, hk16_hv16 1x32768 (CP) 520 -> 451, hk2_hv8 1x32768 (CP) 296 ->
265; o / ht errors unchanged. Measured and not kept: an L2 prefetch of chunk c + 2 / c + 3's rows by the
producer's idle threads (L2 hit rate 46 -> 62%, kernel time within 1%: the loads' latency is not DRAM's);
K_r = diag(r) K formed by the wu warpgroup in shared memory to take the Vr tile off the state's chain
(947 -> 1187 us: the wu warpgroup is back on the critical path).
The C x BV tiles a role hands on (U, -W, Vd, Vr) are formed in place on the role's dead accumulator and
copied to shared memory whole (stmatrix), not stored element-wise from the fragment layout: the state
chain issues 8 stmatrix instead of 64 2-byte stores a chunk. Kernel time in the API's forward (session 13):
hk16_hv64 1x32768 1232 -> 1076 us, hk16_hv64 8192x4 1242 -> 1080, hk16_hv16 1x32768 (CP) 588 -> 519,
hk2_hv8 1x32768 (CP) 334 -> 297; o / ht errors unchanged.
Shared memory at BV = 64: ring 2 x 56 KB + S_s, Vd_s 48 KB + W_s 2 x 16 KB + Vr_s 8 KB + O_s 8 KB
= 208.5 KB.
"""

import functools

import tilelang.language as T
from tilelang import PassConfigKey

from ..common.build import compile_for
from .chunk_fwd_roles import roles

THREADS = 512  # producer, state, output, wu warpgroups
NREG_PRODUCER = 24
NREG_STATE = 216
NREG_OUTPUT = 128
NREG_WU = 144
BAR_STATE = 1  # named barrier id of the state warpgroup's internal syncs (0 is __syncthreads)
BAR_WU = 3  # the wu warpgroup's own shared-memory writes before its wgmma reads


def chunk_fwd_wy_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str,
                        state_v_first: bool, arch: str):
    """Compiled warp-specialized forward recurrence for one head configuration (runtime arguments
    as chunk_fwd.chunk_fwd_kernel). QLABENCH_WS_AUTO_SYNC=1 keeps TileLang's automatic
    shared-memory syncs on top of the explicit ones (a race-debugging A/B, see the header)."""
    import os

    auto_sync = os.environ.get("QLABENCH_WS_AUTO_SYNC", "0") == "1"
    return _chunk_fwd_wy(h_qk, h_v, K, V, BV, C, dtype, state_v_first, arch, auto_sync)


def shared_memory_bytes(K: int, BV: int, C: int = 64, elem: int = 2) -> int:
    """Dynamic shared memory of the kernel, from its allocations (the mbarriers are static)."""
    ring = 2 * (2 * C * K + C * BV + 2 * C * C) * elem + 2 * C * 4  # Q, K, V, Ag, Pm, gam per slot
    handoff = 2 * (K * BV + C * BV) * elem  # S_s, Vd_s per parity
    scratch = C * BV * elem + 2 * C * K * elem  # Vr_s, W_s per parity
    o_stage = C * BV * elem  # O_s, the output warpgroup's TMA-store staging tile
    return ring + handoff + scratch + o_stage


@functools.cache
def _chunk_fwd_wy(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str, state_v_first: bool,
                  arch: str, auto_sync: bool):
    if C != 64:
        raise ValueError(f"chunk_fwd_wy is written for C = 64 (one m64 wgmma per row block), got {C}")
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
    def wu_step(slot: int, c, n_run, bos, eos, skip, K_s, V_s, Ag_s, gam_s, W_s, Uw_f, W_f, Age_f, full, wu_ready,
                has_h0):
        if c < n_run:
            ph = (c // 2) & 1
            t0 = bos + (skip + c) * C
            T.mbarrier_wait_parity(full[slot], ph)
            # rows past the end: 0 * non-finite is not 0 in the products below; the transition mode
            # (has_h0 == 2) reads V as zero
            if t0 + C > eos or has_h0 == 2:
                for i, d in T.Parallel(C, K):
                    if t0 + i >= eos:
                        K_s[i, d] = T.cast(0, dtype)
                for i, j in T.Parallel(C, BV):
                    if t0 + i >= eos or has_h0 == 2:
                        V_s[i, j] = T.cast(0, dtype)
                T.fence_proxy_async()
                T.sync_threads(BAR_WU, 128)
            # Ag diag(-e) on registers (wgmma's A operand from registers): W's column scaling and sign need no
            # shared-memory round trip; U = Ag V and -W = Ag diag(-e) K are issued together, one wait
            T.copy(Ag_s, Age_f)
            for i, j in T.Parallel(C, C):
                Age_f[i, j] = T.cast(T.cast(Age_f[i, j], "float32") * -T.exp(gam_s[j]), dtype)
            T.wgmma_gemm(Ag_s, V_s, Uw_f, clear_accum=True)
            T.wgmma_gemm(Age_f, K_s, W_f, clear_accum=True)
            T.wait_wgmma(0)
            T.sync_threads(BAR_WU, 128)  # every warp's product read V_s
            T.copy(Uw_f, V_s)
            T.copy(W_f, W_s)
            T.fence_proxy_async()
            T.sync_threads(BAR_WU, 128)
            T.mbarrier_arrive(wu_ready[slot])

    @T.macro
    def state_step(slot: int, c, n_run, bos, eos, skip, K_s, V_s, W_s, gam_s, S_s, Vd_s, Vr_s,
                   S_f, U_f, wu_ready, empty, s_ready, vd_ready, o_free):
        if c < n_run:
            ph = (c // 2) & 1
            t0 = bos + (skip + c) * C
            T.mbarrier_wait_parity(wu_ready[slot], ph)
            T.mbarrier_wait_parity(o_free[slot], ph ^ 1)
            T.copy(S_f, S_s)
            T.fence_proxy_async()
            T.sync_threads(BAR_STATE, 128)
            T.mbarrier_arrive(s_ready[slot])

            T.copy(V_s, U_f)  # U (bf16, the wu warpgroup's) as the accumulator's start
            T.gemm(W_s, S_s, U_f)  # U_f = U - W S = Vd (W_s holds -W)
            R.handoff_vd(U_f, gam_s, Vd_s, Vr_s, t0, eos)
            T.fence_proxy_async()
            T.sync_threads(BAR_STATE, 128)
            T.mbarrier_arrive(vd_ready[slot])

            for i, j in T.Parallel(K, BV):
                S_f[i, j] = S_f[i, j] * T.exp(gam_s[C - 1])
            T.gemm(K_s, Vr_s, S_f, transpose_A=True)
            T.mbarrier_arrive(empty[slot])

    def chunk_fwd_wy(
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
            # state warpgroup scratch; the wu warpgroup's -W per parity
            Vr_s = T.alloc_shared((C, BV), dtype)
            W0 = T.alloc_shared((C, K), dtype)
            W1 = T.alloc_shared((C, K), dtype)
            # output warpgroup: O of a whole chunk on its way to the TMA store
            O_s = T.alloc_shared((C, BV), dtype)
            full = T.alloc_barrier([128, 128])
            full_o = T.alloc_barrier([128, 128])  # Q, Pm (the output's), apart from the chain's K, V, Ag
            wu_ready = T.alloc_barrier([128, 128])
            empty = T.alloc_barrier([256, 256])
            s_ready = T.alloc_barrier([128, 128])
            vd_ready = T.alloc_barrier([128, 128])
            o_free = T.alloc_barrier([128, 128])
            S_f = T.alloc_fragment((K, BV), "float32")
            U_f = T.alloc_fragment((C, BV), "float32")
            O_f = T.alloc_fragment((C, BV), "float32")
            Uw_f = T.alloc_fragment((C, BV), "float32")
            W_f = T.alloc_fragment((C, K), "float32")
            Age_f = T.alloc_fragment((C, C), dtype)  # the wu warpgroup's Ag diag(-e), wgmma's A from registers

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
                    state_step(0, 2 * p, n_run, bos, eos, skip, K0, V0, W0, G0, S0, D0, Vr_s,
                               S_f, U_f, wu_ready, empty, s_ready, vd_ready, o_free)
                    state_step(1, 2 * p + 1, n_run, bos, eos, skip, K1, V1, W1, G1, S1, D1, Vr_s,
                               S_f, U_f, wu_ready, empty, s_ready, vd_ready, o_free)
                if store_final != 0:
                    R.store_state(S_f, ht, n, h, v0)
            elif tx < 384:
                T.set_max_nreg(NREG_OUTPUT, 0)
                R.output_role(n_pairs, n_run, bos, eos, skip, n, n_cu, n_tok, h, v0, scale, store_h, chunk_offsets,
                              h_out, o, ring0, ring1, (S0, D0), (S1, D1), O_f, O_s, full_o, empty, s_ready,
                              vd_ready, o_free)
            else:
                T.set_max_nreg(NREG_WU, 1)
                for p in T.serial(n_pairs):
                    wu_step(0, 2 * p, n_run, bos, eos, skip, K0, V0, A0, G0, W0, Uw_f, W_f, Age_f, full, wu_ready,
                            has_h0)
                    wu_step(1, 2 * p + 1, n_run, bos, eos, skip, K1, V1, A1, G1, W1, Uw_f, W_f, Age_f, full, wu_ready,
                            has_h0)

    configs = {} if auto_sync else {PassConfigKey.TL_DISABLE_THREAD_STORAGE_SYNC: True}
    return compile_for(T.prim_func(chunk_fwd_wy), arch, configs)
