r"""chunk_fwd_v128: the forward chunk recurrence at V tile 128 (Hopper, sm_90a), sm90's recurrence where the
grid's makespan says BV 128 finishes first (forward.forward_value_tile, value_tile.FORWARD_STEP_US[128]:
many (sequence, v-head) chains). Never the CP transition pass: it has no transition mode (has_h0 is 0 or 1;
forward_cp picks its tile among 32 / 64).

Why: at BV 64 every (chunk, v-head) does its V-tile-independent work twice (the K, Q, Ag, Pm boxes, W = Ag
diag(e) K or K S's row block, the hand-off tiles); session 18 measured that the recurrence pays for every
extra product even off the state chain. One block per (sequence, v-head) does it once.
H200 (session 19, results/h200/2026-12-02_s19/, recurrence alone, us, BV 64 chunk_fwd_wy -> BV 128):
hk16_hv64 8192x4 916 -> 789, 4096x8 971 -> 793; hk32_hv32 8192x4 468 -> 429, 4096x8 515 -> 424; hk16_hv32
8192x4 460 -> 406; hk8_hv32 4096x8 472 -> 406; a step costs 3.08 us (1.54 per 64 columns, wy 1.77), so
where BV 64 fits one wave (1x32768 at 64 v-heads: 901 vs 1577) the rule keeps 64. o / ht errors unchanged.
Pm on chip (the output warpgroup forms it; kkt_solve compiled without Pm): whole forward, ms, Pm loaded -> on
chip (same call, 2026-12-02_s19/pm-*.log): hk16_hv64 8192x4 1.417 -> 1.330 (kkt_solve 614 -> 484 us, this kernel
789 -> 825), 4096x8 1.425 -> 1.334; hk32_hv32 8192x4 0.751 -> 0.691, 4096x8 0.739 -> 0.712; hk16_hv32 8192x4
0.723 -> 0.679; hk8_hv32 4096x8 0.717 -> 0.678. (At BV 64 the same move was zero-sum, session 18: two V tiles
formed Pm twice per (chunk, head).)

Formula per chunk (as chunk_fwd_ws.py; gam = in-chunk cumsum of g clamped to the sequence's last token,
e = exp(gam), r = exp(gam_C - gam), S is K x V fp32, Ag from kkt_solve, Pm = scale Gam .* Q K^T formed here):
    U  = K S                      W  = V - diag(e) U
    Vd = Ag W
    O  = scale diag(e) Q S + Pm Vd
    S  = exp(gam_C) S + K^T diag(r) Vd

Grid (1, N * H_v), 512 threads; roles split so that no warpgroup holds two C x V accumulators:
  * WG0 producer (24 registers): the ring's TMA boxes (chunk_fwd_roles.producer_role: K, V, Ag on full,
    Q on full_o, gam; no Pm).
  * WG1 state (176): owns S (128 x 128 fp32, 128 registers a thread). Per chunk: wait full (gam, K) and
    o_free of chunk c - 1 (the output is done with S_s); S_s = bf16(S); arrive s_ready; S *= exp(gam_C);
    wait vd_ready; S += K^T Vr; arrive empty.
  * WG2 value (152): wait full, s_ready; U = K S_s; W = V - e U (rows past eos zero) written over V_s; Vd =
    Ag W; wait o_free of chunk c - 1 (the output is done with Vd_s); Vd_s = Vd, Vr_s = r Vd; K_s rows past
    eos zeroed; arrive vd_ready, empty.
  * WG3 output (160): chunk_fwd_roles.output_role (pm_on_chip) with both hand-off parities on the one S_s /
    Vd_s pair: per chunk Q K^T (wait full_o, full), Pm = scale Gam .* Q K^T into the ring slot's P tile (one
    C x C fp32 fragment, before S is ready: off the state chain), then O = scale diag(e) Q S + Pm Vd.
Hazards: S_s(c) is written after the state's K^T Vr(c - 1), which waited vd_ready(c - 1), which the value
warpgroup arrives after its K S(c - 1): the value warpgroup is past S_s(c - 1); the output's reads of S_s and
Vd_s are fenced by o_free. Vr_s(c) is written after s_ready(c), i.e. after the state's K^T Vr(c - 1).
Shared memory (bf16 unless noted): ring 2 x (Q, K, V 16 KB each, Ag, P 8 KB each, gam 256 B) = 128.5 KB;
S_s 32 KB, Vd_s, Vr_s, O_s 16 KB each: 208.5 KB.
Registers (ptxas, sm_90a, both layouts): 44 bytes of spill stores in the output, value and prologue regions
(loop-invariant addresses), none in the state region, no serialized wgmma. With the transition mode's identity
start (128 predicated selects) ptxas kept S in local memory through the chunk loop at any state quota
(1.4 KB of spills, serialized wgmma: session 18's prototype; SASS read in session 19).
"""

import functools

import tilelang.language as T
from tilelang import PassConfigKey

from ..common.build import compile_for
from .chunk_fwd_roles import roles

THREADS = 512  # producer, state, value, output warpgroups
NREG_PRODUCER = 24
NREG_STATE = 176
NREG_VALUE = 152
NREG_OUTPUT = 160
BAR_STATE = 1  # the state warpgroup's named barrier (2 is the output's, chunk_fwd_roles.BAR_OUTPUT)
BAR_VALUE = 3  # the value warpgroup's


def chunk_fwd_v128_kernel(h_qk: int, h_v: int, K: int, V: int, BV: int, C: int, dtype: str,
                          state_v_first: bool, arch: str):
    """Compiled recurrence (runtime arguments as chunk_fwd.chunk_fwd_kernel); BV must be V = 128."""
    if BV != V or V != 128 or K != 128:
        raise ValueError(f"chunk_fwd_v128 runs one V tile of 128 columns (K = V = 128), got K={K}, V={V}, BV={BV}")
    return _chunk_fwd_v128(h_qk, h_v, K, V, C, dtype, state_v_first, arch)


chunk_fwd_v128_kernel.forms_pm = True  # the output warpgroup forms Pm (forward.forms_pm: kkt_solve without it)


@functools.cache
def _chunk_fwd_v128(h_qk: int, h_v: int, K: int, V: int, C: int, dtype: str, state_v_first: bool, arch: str):
    if C != 64:
        raise ValueError(f"chunk_fwd_v128 is written for C = 64, got {C}")
    BV = V
    group = h_v // h_qk
    n_tok = T.dynamic("n_tok")
    n_cu = T.dynamic("n_cu")
    n_h0 = T.dynamic("n_h0")
    n_ht = T.dynamic("n_ht")
    n_hc = T.dynamic("n_hc")
    n_skip = T.dynamic("n_skip")
    n_ord = T.dynamic("n_ord")
    state_shape = (h_v, V, K) if state_v_first else (h_v, K, V)

    R = roles(C, K, BV, dtype, state_v_first, pm_on_chip=True)

    @T.macro
    def load_state(S_f, h0, has_h0, n, h):
        """S from h0 (one T.copy: vector loads) or zero. No transition mode (has_h0 == 2): its 128
        predicated identity selects made ptxas keep S in local memory through the chunk loop (1.4 KB of
        spills, serialized wgmma; session 19, SASS); the host never launches this kernel for it."""
        if has_h0 != 0:
            if state_v_first:
                for i, j in T.Parallel(K, BV):
                    S_f[i, j] = h0[n, h, j, i]
            else:
                T.copy(h0[n, h, :, :], S_f)
        else:
            T.clear(S_f)

    @T.macro
    def wait_prev_output(slot: int, c, o_free):
        """The output warpgroup is done with chunk c - 1's S_s and Vd_s (slot ^ 1, its ring phase)."""
        if c > 0:
            T.mbarrier_wait_parity(o_free[1 - slot], ((c - 1) // 2) & 1)

    @T.macro
    def state_step(slot: int, c, n_run, K_s, gam_s, S_s, Vr_s, S_f, full, empty, s_ready, vd_ready, o_free):
        if c < n_run:
            ph = (c // 2) & 1
            T.mbarrier_wait_parity(full[slot], ph)
            wait_prev_output(slot, c, o_free)
            T.copy(S_f, S_s)
            T.fence_proxy_async()
            T.sync_threads(BAR_STATE, 128)
            T.mbarrier_arrive(s_ready[slot])
            for i, j in T.Parallel(K, BV):
                S_f[i, j] = S_f[i, j] * T.exp(gam_s[C - 1])
            T.mbarrier_wait_parity(vd_ready[slot], ph)
            T.gemm(K_s, Vr_s, S_f, transpose_A=True)
            T.mbarrier_arrive(empty[slot])

    @T.macro
    def value_step(slot: int, c, n_run, bos, eos, skip, K_s, V_s, Ag_s, gam_s, S_s, Vd_s, Vr_s, U_f, full, empty,
                   s_ready, vd_ready, o_free):
        if c < n_run:
            ph = (c // 2) & 1
            t0 = bos + (skip + c) * C
            T.mbarrier_wait_parity(full[slot], ph)
            T.mbarrier_wait_parity(s_ready[slot], ph)
            T.gemm(K_s, S_s, U_f, clear_accum=True)  # U = K S
            for i, j in T.Parallel(C, BV):
                U_f[i, j] = T.if_then_else(t0 + i < eos, V_s[i, j] - T.exp(gam_s[i]) * U_f[i, j],
                                           0.0)
            T.sync_threads(BAR_VALUE, 128)  # every thread past its reads of V_s
            T.copy(U_f, V_s)  # W over V
            T.fence_proxy_async()
            T.sync_threads(BAR_VALUE, 128)
            T.gemm(Ag_s, V_s, U_f, clear_accum=True)  # Vd = Ag W
            wait_prev_output(slot, c, o_free)
            R.handoff_vd(U_f, gam_s, Vd_s, Vr_s, t0, eos)
            if t0 + C > eos:
                for i, d in T.Parallel(C, K):
                    if t0 + i >= eos:
                        K_s[i, d] = T.cast(0, dtype)
            T.fence_proxy_async()
            T.sync_threads(BAR_VALUE, 128)
            T.mbarrier_arrive(vd_ready[slot])
            T.mbarrier_arrive(empty[slot])

    def chunk_fwd_v128(
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
        with T.Kernel(1, (n_cu - 1) * h_v, threads=THREADS) as (iv, nh):
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
            S_s = T.alloc_shared((K, BV), dtype)
            Vd_s = T.alloc_shared((C, BV), dtype)
            Vr_s = T.alloc_shared((C, BV), dtype)
            O_s = T.alloc_shared((C, BV), dtype)
            full = T.alloc_barrier([128, 128])
            full_o = T.alloc_barrier([128, 128])
            empty = T.alloc_barrier([384, 384])  # state, value and output threads
            s_ready = T.alloc_barrier([128, 128])
            vd_ready = T.alloc_barrier([128, 128])
            o_free = T.alloc_barrier([128, 128])
            S_f = T.alloc_fragment((K, BV), "float32")
            U_f = T.alloc_fragment((C, BV), "float32")
            O_f = T.alloc_fragment((C, BV), "float32")
            P_f = T.alloc_fragment((C, C), "float32")  # the output's Q K^T, then Pm

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
                load_state(S_f, h0, has_h0, n, h)
                for p in T.serial(n_pairs):
                    state_step(0, 2 * p, n_run, K0, G0, S_s, Vr_s, S_f, full, empty, s_ready, vd_ready, o_free)
                    state_step(1, 2 * p + 1, n_run, K1, G1, S_s, Vr_s, S_f, full, empty, s_ready, vd_ready, o_free)
                if store_final != 0:
                    R.store_state(S_f, ht, n, h, v0)
            elif tx < 384:
                T.set_max_nreg(NREG_VALUE, 1)
                for p in T.serial(n_pairs):
                    value_step(0, 2 * p, n_run, bos, eos, skip, K0, V0, A0, G0, S_s, Vd_s, Vr_s, U_f, full, empty,
                               s_ready, vd_ready, o_free)
                    value_step(1, 2 * p + 1, n_run, bos, eos, skip, K1, V1, A1, G1, S_s, Vd_s, Vr_s, U_f, full,
                               empty, s_ready, vd_ready, o_free)
            else:
                T.set_max_nreg(NREG_OUTPUT, 1)
                R.output_role(n_pairs, n_run, bos, eos, skip, n, n_cu, n_tok, h, v0, scale, store_h, chunk_offsets,
                              h_out, o, ring0, ring1, (S_s, Vd_s), (S_s, Vd_s), O_f, O_s, full_o, empty, s_ready,
                              vd_ready, o_free, P_f, full)

    return compile_for(T.prim_func(chunk_fwd_v128), arch, {PassConfigKey.TL_DISABLE_THREAD_STORAGE_SYNC: True})
