"""cp_correct: the CP correction chain in one launch (forward: piece initial states; backward: piece
terminal gradients), instead of one batched matmul launch per piece position.

Formula. For every long sequence l, v-head h and piece position s = 0 .. n_out - 2 (a serial chain):

    X[0]     = init[i, h],                                 i = init_rows[l]
    X[s + 1] = L[j, h] + flag[m, h] * (M[m, h] X[s]),     j = src[s, l],  m = msrc[s, l]

X, L are K x V fp32 states in the kernels' [K, V] layout, M is K x K fp32. Forward (forward_cp.py (c)):
X = the piece initial states, L = S_loc, M = the piece transitions; backward (backward_cp.py (d)):
X = the piece terminal gradients, L = dS_loc, M = the transposed transitions (bwd_dh from terminal I
stores M^T), or the forward's M itself read transposed (``transpose_m``: the products take M's shared tile
as a transposed operand) through ``msrc``, the row of M and flag of each step (the forward's chain
covers other pieces than the backward's; msrc = src when M and L share rows): no transposing copy, no
gather of M. msrc is a table of its own, not an index into src's rows (m_rows[src[s, l]]): TileLang took
230 s instead of 17 s to compile the kernel with that nested indirection in the TMA addresses. ``flag`` = 0 where the
transition was dropped by the warm-up truncation (or is not needed): X[s + 1] = L then, and M[m, h] is
never read (it may hold anything). Row j of L for a chain slot with no piece is an extra row of the caller's
table (flag 0) whose value does not matter: out_rows sends those slots to a scratch row that nothing reads. ``init`` is read through ``init_rows`` too (the forward's per-sequence h0, the backward's
local gradients themselves: L and init may be one tensor), so no caller gathers the chain's start rows.

Product precision. M X runs on tensor cores in bf16 with a hi / lo split of both factors
(Y = bf16(Y) + bf16(Y - bf16(Y)) for Y = M, X): M X ~ M_hi X_hi + M_hi X_lo + M_lo X_hi, three products
with fp32 accumulation; the dropped M_lo X_lo term and the rounding of the lo parts leave a relative error
of about 2^-16 per step (one bf16 product: 2^-8), so a chain of 30+ steps stays near fp32. M's split is
done once for every row before the launch (``split_hi_lo_kernel``, one launch: two bf16 tensors, the
same roundings the kernel did per step before, session 10), by the caller where it keeps it (``split_m``:
the CP forward splits its transitions once and the backward's chain reads that split); X's in the kernel.

Loads. The chain's step s needs M_hi, M_lo and the L tile of row j = src[s] only, not X, so they are
prefetched: TMA loads into a 2-stage ring (one mbarrier per stage), issued two steps ahead, so a step
waits only on its products. (Before: every step read M as fp32 from global memory with plain loads and
split it in registers, all on the chain: ~8.5 us per step at hk2_hv8 1x32768, 136 us per launch.)

Tables and products. A block stages its column of src, msrc, out_rows and its head's flag of every step in shared
memory once (at most MAX_OUT outputs per launch; longer chains run in windows), so no step waits on a global load
of an index (a dependent msrc -> flag pair and the out_rows read were on every step's path). On sm90 the three
products of a step are issued as one group of wgmmas with one wait (T.gemm waits after each).

Grid: (V / BV, nl * H_v), one block per (V tile, long sequence, v-head) walking the chain; 128 threads
(one warpgroup: 128-row products are two m64 wgmma row blocks on sm90). The steps run in pairs (stage 0,
stage 1) so the ring's buffers are indexed by Python constants.
Shared memory (K = 128, BV = 32): ring 2 x (M_hi, M_lo 2 x 32 KB + L tile 16 KB) = 160 KB + X^T hi / lo
2 x 8 KB + tables 4 x 512 B = 178 KB (one block per SM; the grids are small: V / BV x long sequences x heads).
sm120 / sm121 (99 KB per block) get one stage, 98 KB: the next step's loads then start when a step ends.
Registers: X and the product accumulator, K x BV fp32 each: 32 + 32 per thread.
"""

import functools

import tilelang.language as T
import torch

from .build import compile_for

THREADS = 128
MAX_OUT = 128  # chain outputs per launch (the tables staged in shared memory); longer chains run in windows


@functools.cache
def cp_correct_kernel(H: int, K: int, V: int, BV: int, arch: str, transpose_m: bool = False):
    """Compiled correction chain for H v-heads, K x V states and V tiles of BV columns; ``transpose_m``:
    the products use M^T (the shared M tiles as transposed operands). Chain output s of long sequence l goes to row
    out_rows[s, l] of a flat `[n_rows, H, K, V]` out: the callers' per-piece state tables, written in place (no slot
    buffer to gather the pieces' rows from). At most MAX_OUT outputs per launch (`cp_correct` runs longer chains in
    windows)."""
    if V % BV:
        raise ValueError(f"V ({V}) must be a multiple of the V tile BV ({BV})")
    NV = V // BV
    S = 1 if arch.startswith("sm12") else 2  # ring stages: two need 176 KB, over sm120's 99 KB per block
    wgmma = arch == "sm90"  # the three products issued together, one wait (T.gemm waits after each)
    n_out = T.dynamic("n_out")
    n_steps = T.dynamic("n_steps")
    n_src = T.dynamic("n_src")
    n_m = T.dynamic("n_m")
    n_long = T.dynamic("n_long")
    n_rows = T.dynamic("n_rows")
    n_init = T.dynamic("n_init")

    @T.macro
    def fetch(st: int, s, h, v0, L, M_hi, M_lo, src_s, msrc_s, jm, Mh_s, Ml_s, L_s, full):
        """Stage st <- step s's M_hi, M_lo rows and L tile (TMA on full[st]); nothing past the chain. The rows are
        read from the staged tables into registers first (jm): a shared-memory read inside the TMA issue's
        one-thread branch would get barriers inserted there."""
        if s < n_out - 1:
            jm[0] = src_s[s]
            jm[1] = msrc_s[s]
            T.tma_copy(M_hi[jm[1], h, :, :], Mh_s, barrier=full[st])
            T.tma_copy(M_lo[jm[1], h, :, :], Ml_s, barrier=full[st])
            T.tma_copy(L[jm[0], h, :, v0:v0 + BV], L_s, barrier=full[st])
            T.mbarrier_arrive(full[st])

    @T.macro
    def store(s, h, v0, out, row_s, X_f):
        """Chain output s into row row_s[s] (= out_rows[s, l])."""
        r = row_s[s]
        for i, c in T.Parallel(K, BV):
            out[r, h, i, v0 + c] = X_f[i, c]

    @T.macro
    def products(Mh_s, Ml_s, Xt_hi, Xt_lo, P_f):
        """P = M_hi X_hi + M_hi X_lo + M_lo X_hi (M^T with transpose_m)."""
        if wgmma:
            T.fence_proxy_async()
            T.sync_threads()
            T.wgmma_gemm(Mh_s, Xt_hi, P_f, transpose_A=transpose_m, transpose_B=True, clear_accum=True)
            T.wgmma_gemm(Mh_s, Xt_lo, P_f, transpose_A=transpose_m, transpose_B=True)
            T.wgmma_gemm(Ml_s, Xt_hi, P_f, transpose_A=transpose_m, transpose_B=True)
            T.wait_wgmma(0)
        else:
            T.gemm(Mh_s, Xt_hi, P_f, transpose_A=transpose_m, transpose_B=True, clear_accum=True)
            T.gemm(Mh_s, Xt_lo, P_f, transpose_A=transpose_m, transpose_B=True)
            T.gemm(Ml_s, Xt_hi, P_f, transpose_A=transpose_m, transpose_B=True)

    @T.macro
    def step(st: int, s, h, v0, L, M_hi, M_lo, src_s, msrc_s, flag_s, row_s, jm, out, Mh_s, Ml_s, L_s, Xt_hi,
             Xt_lo, X_f, P_f, full):
        """X <- L[j] + flag[m] M[m] X for step s (stage st), stored as output s + 1; then stage st <- step s + S."""
        if s < n_out - 1:
            T.mbarrier_wait_parity(full[st], (s // S) & 1)
            if flag_s[s] != 0:
                for i, c in T.Parallel(K, BV):
                    Xt_hi[c, i] = T.cast(X_f[i, c], "bfloat16")
                for i, c in T.Parallel(K, BV):
                    Xt_lo[c, i] = T.cast(X_f[i, c] - T.cast(T.cast(X_f[i, c], "bfloat16"), "float32"), "bfloat16")
                products(Mh_s, Ml_s, Xt_hi, Xt_lo, P_f)
                for i, c in T.Parallel(K, BV):
                    X_f[i, c] = P_f[i, c] + L_s[i, c]
            else:
                for i, c in T.Parallel(K, BV):
                    X_f[i, c] = L_s[i, c]
            store(s + 1, h, v0, out, row_s, X_f)
            T.sync_threads()  # every read of stage st done before it is refilled
            fetch(st, s + S, h, v0, L, M_hi, M_lo, src_s, msrc_s, jm, Mh_s, Ml_s, L_s, full)

    @T.prim_func
    def cp_correct(
        init: T.Tensor((n_init, H, K, V), "float32"),
        init_rows: T.Tensor((n_long,), "int32"),
        L: T.Tensor((n_src, H, K, V), "float32"),
        M_hi: T.Tensor((n_m, H, K, K), "bfloat16"),
        M_lo: T.Tensor((n_m, H, K, K), "bfloat16"),
        flag: T.Tensor((n_m, H), "int32"),
        src: T.Tensor((n_steps, n_long), "int32"),
        msrc: T.Tensor((n_steps, n_long), "int32"),
        out: T.Tensor((n_rows, H, K, V), "float32"),
        out_rows: T.Tensor((n_out, n_long), "int32"),
    ):
        with T.Kernel(NV, n_long * H, threads=THREADS) as (iv, lh):
            Mh0 = T.alloc_shared((K, K), "bfloat16")
            Ml0 = T.alloc_shared((K, K), "bfloat16")
            L0 = T.alloc_shared((K, BV), "float32")
            if S == 2:
                Mh1 = T.alloc_shared((K, K), "bfloat16")
                Ml1 = T.alloc_shared((K, K), "bfloat16")
                L1 = T.alloc_shared((K, BV), "float32")
            else:
                Mh1, Ml1, L1 = Mh0, Ml0, L0
            Xt_hi = T.alloc_shared((BV, K), "bfloat16")
            Xt_lo = T.alloc_shared((BV, K), "bfloat16")
            # this block's chain tables, staged once: no global load (and its latency) on any step
            src_s = T.alloc_shared((MAX_OUT,), "int32")
            msrc_s = T.alloc_shared((MAX_OUT,), "int32")
            flag_s = T.alloc_shared((MAX_OUT,), "int32")
            row_s = T.alloc_shared((MAX_OUT,), "int32")
            jm = T.alloc_local((2,), "int32")  # the fetched step's L row and M row
            full = T.alloc_barrier([128, 128])
            X_f = T.alloc_fragment((K, BV), "float32")
            P_f = T.alloc_fragment((K, BV), "float32")
            l = lh // H
            h = lh % H
            v0 = iv * BV
            for t in T.Parallel(MAX_OUT):
                if t < n_out:
                    row_s[t] = out_rows[t, l]
                if t < n_out - 1:
                    src_s[t] = src[t, l]
                    msrc_s[t] = msrc[t, l]
                    flag_s[t] = flag[msrc[t, l], h]
            T.sync_threads()
            fetch(0, 0, h, v0, L, M_hi, M_lo, src_s, msrc_s, jm, Mh0, Ml0, L0, full)
            if S == 2:
                fetch(1, 1, h, v0, L, M_hi, M_lo, src_s, msrc_s, jm, Mh1, Ml1, L1, full)
            r0 = init_rows[l]
            for i, c in T.Parallel(K, BV):
                X_f[i, c] = init[r0, h, i, v0 + c]
            store(0, h, v0, out, row_s, X_f)
            for p in T.serial(T.ceildiv(n_out - 1, 2)):
                step(0, 2 * p, h, v0, L, M_hi, M_lo, src_s, msrc_s, flag_s, row_s, jm, out, Mh0, Ml0, L0, Xt_hi,
                     Xt_lo, X_f, P_f, full)
                step(S - 1, 2 * p + 1, h, v0, L, M_hi, M_lo, src_s, msrc_s, flag_s, row_s, jm, out, Mh1, Ml1, L1,
                     Xt_hi, Xt_lo, X_f, P_f, full)

    return compile_for(cp_correct, arch)


BV_CORRECT = 32  # V tile: 4 blocks per (long sequence, v-head) at V = 128
SPLIT_ROWS = 64  # rows of M per block of the hi / lo split


@functools.cache
def split_hi_lo_kernel(K: int, arch: str):
    """M `[n_rows, K]` fp32 -> (M_hi, M_lo) bf16 with M_hi = bf16(M), M_lo = bf16(M - M_hi): one launch
    instead of torch's four (cast, cast back, subtract, cast), each a launch slot in a CUDA graph."""
    n_rows = T.dynamic("n_rows")

    @T.prim_func
    def split_hi_lo(M: T.Tensor((n_rows, K), "float32"), M_hi: T.Tensor((n_rows, K), "bfloat16"),
                    M_lo: T.Tensor((n_rows, K), "bfloat16")):
        with T.Kernel(T.ceildiv(n_rows, SPLIT_ROWS), threads=THREADS) as b:
            for i, j in T.Parallel(SPLIT_ROWS, K):
                r = b * SPLIT_ROWS + i
                if r < n_rows:
                    hi = T.cast(M[r, j], "bfloat16")
                    M_hi[r, j] = hi
                    M_lo[r, j] = T.cast(M[r, j] - T.cast(hi, "float32"), "bfloat16")

    return compile_for(split_hi_lo, arch)


def split_m(M: torch.Tensor, arch: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(M_hi, M_lo) bf16 of M `[n, H, K, K]` fp32 (contiguous): what cp_correct reads, split once (one launch)."""
    if not M.is_contiguous():
        raise ValueError(f"split_m: M must be contiguous, got strides {M.stride()}")
    K = M.shape[-1]
    M_hi = torch.empty(M.shape, dtype=torch.bfloat16, device=M.device)
    M_lo = torch.empty_like(M_hi)
    split_hi_lo_kernel(K, arch)(M.view(-1, K), M_hi.view(-1, K), M_lo.view(-1, K))
    return M_hi, M_lo


def cp_correct(init, L, M, flag, src, out, arch: str, *, msrc=None, transpose_m: bool = False, out_rows=None,
               init_rows=None):
    """Launches the chain (module docstring) on the device; output 0 of long sequence l = init[init_rows[l]].

    Args: init `[n_init, H, K, V]` (may be L itself), L `[n_src, H, K, V]` fp32; init_rows `[n_long]` int32 (None:
    init has n_long rows, taken in order; n_long = src.shape[1]); M `[n_m, H, K, K]` fp32, or its (M_hi, M_lo)
    from `split_m` (contiguous, [K, V] layout); flag `[n_m, H]` int32; src `[n_out - 1, n_long]` int32 row
    indices into L; msrc (src's shape, int32) the row of M and flag of each step (None: src, n_m = n_src);
    transpose_m: the chain multiplies by M^T; out, written: with ``out_rows`` (`[n_out, n_long]` int32) a flat
    `[n_rows, H, K, V]` fp32 whose row out_rows[s, l] takes output s of long sequence l (rows may repeat: a chain
    slot past a sequence's pieces may go to one scratch row), else `[n_out, n_long, H, K, V]` fp32 (output s of l
    in out[s, l]).
    """
    _, H, K, V = init.shape
    pair = isinstance(M, tuple)
    msrc = src if msrc is None else msrc
    for name, x in (("init", init), ("L", L), ("flag", flag), ("src", src), ("msrc", msrc), ("out", out)) + (
            (("M_hi", M[0]), ("M_lo", M[1])) if pair else (("M", M),)):
        if not x.is_contiguous():
            raise ValueError(f"cp_correct: {name} must be contiguous, got strides {x.stride()}")
    if msrc.dtype != torch.int32 or msrc.shape != src.shape:
        raise ValueError(f"cp_correct: msrc must be int32 of src's shape {tuple(src.shape)}, got {msrc.dtype} "
                         f"{tuple(msrc.shape)}")
    n_long = src.shape[1]
    if init_rows is None:
        if init.shape[0] != n_long:
            raise ValueError(f"cp_correct: without init_rows init must have src's {n_long} columns as rows, got "
                             f"{init.shape[0]}")
        init_rows = torch.arange(n_long, dtype=torch.int32, device=init.device)
    elif init_rows.dtype != torch.int32 or tuple(init_rows.shape) != (n_long,) or not init_rows.is_contiguous():
        raise ValueError(f"cp_correct: init_rows must be contiguous int32 of shape {(n_long,)}, got "
                         f"{init_rows.dtype} {tuple(init_rows.shape)}")
    if out_rows is None:
        n_out = out.shape[0]
        flat = out.view(n_out * n_long, H, K, V)
        out_rows = torch.arange(n_out * n_long, dtype=torch.int32, device=out.device).view(n_out, n_long)
    else:
        n_out, flat = out_rows.shape[0], out
        if out_rows.dtype != torch.int32 or tuple(out_rows.shape) != (src.shape[0] + 1, n_long) \
                or not out_rows.is_contiguous():
            raise ValueError(f"cp_correct: out_rows must be contiguous int32 of shape {(src.shape[0] + 1, n_long)}, "
                             f"got {out_rows.dtype} {tuple(out_rows.shape)}")
    if n_out == 1:  # no step: the chain is its start
        flat.index_copy_(0, out_rows[0].long(), init.index_select(0, init_rows.long()))
        return out
    bv = BV_CORRECT if V % BV_CORRECT == 0 else V
    M_hi, M_lo = M if pair else split_m(M, arch)
    kernel = cp_correct_kernel(H, K, V, bv, arch, bool(transpose_m))
    # windows of MAX_OUT outputs; a window after the first starts from the previous one's last output, in its row
    # (a scratch row there belongs to a sequence whose later outputs are all scratch: any value serves)
    for a in range(0, n_out - 1, MAX_OUT - 1):
        b = min(a + MAX_OUT, n_out)
        start, rows0 = (init, init_rows) if a == 0 else (flat, out_rows[a])
        kernel(start, rows0, L, M_hi, M_lo, flag, src[a:b - 1], msrc[a:b - 1], flat, out_rows[a:b])
    return out
