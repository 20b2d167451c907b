"""kkt_solve: the gate-free inverse of one chunk, per (chunk, v-head), and the forward's gated masks.

Formulas (gam = in-chunk cumsum of g, Gam[i, j] = exp(gam_i - gam_j) for j <= i else 0):
    A_k = (I + strict_lower(diag(beta) K K^T))^{-1}   (C x C, unit lower triangular; never reads g,
                                                       the backward re-applies the gate itself)
    Ag  = Gam .* A_k .* beta_col                      (the gated solve the recurrence multiplies by)
    Pm  = scale Gam .* Q K^T                          (the intra-chunk output mask)
Ag and Pm depend only on the chunk, not on the state, so computing them here (all chunks in
parallel, once per v-head) keeps them off the serial chunk recurrence, which only reads them.
Rows past the sequence end are not written. Compiled with store_a False (a forward no backward
follows: forward.solve_chunks), A is not written at all: only the backward reads it. Compiled with
store_pm False (the recurrence forms Pm on chip: chunk_fwd_v128, forward.forms_pm), neither Q nor Q K^T
nor Pm: H200 session 18, 614 -> 486 us at hk16_hv64 8192x4 (upstream's kkt_solve: 441).

Grid: (NCmax chunks, H_v); blocks past the real chunk count exit. Threads: 128 (one warpgroup).
  * K K^T on tensor cores (wgmma 64x64x128, fp32 accumulate); rows past the chunk end are zero.
  * Blockwise inverse in fp32. The 16 x 16 diagonal blocks are inverted by forward substitution on
    CUDA cores (thread (b, c) owns column c of block b: X[i, c] = delta_ic - sum_{j<i} L[i, j] X[j, c],
    a chain of at most 15 steps). Then blocks are merged by doubling, 16 -> 32 -> 64: for a 2s x 2s
    block [[I + L11, 0], [L21, I + L22]] the inverse's lower-left block is -X22 (L21 X11), two
    s x s x s products. 16 -> 32 on CUDA cores (two pairs, 16 x 16 tiles are too small for a 4-warp
    mma partition); 32 -> 64 on tensor cores (mma.sync tf32, fp32 accumulate): ncu on the H200 showed
    the all-CUDA-core version bound by shared-memory traffic (L1/TEX 91% busy, 0.39 ms for 1x32768
    hk16_hv16), most of it in this level. tf32 operands put a relative error of ~6e-5 on A_k
    (float64 experiment on random unit keys), 7x below the bf16 rounding of the stored result.
    (A plain 64-row substitution was a 64-step serial chain per column and dominated the forward.)
    The three inverse steps are TileLang macros in common/tri_inverse.py, shared with blackwell/.
    The diagonal blocks' substitution keeps each thread's column in registers (16 floats, the loops
    unrolled in the IR) instead of re-reading X_s with two 64-thread barriers per row: 249 vs 300 us
    at 1x32768 hk16_hv16, 926 vs 1122 at hk16_hv64, 128 vs 154 at hk2_hv8 (H200, session 7;
    the same operations in the same order).
  * Q K^T on tensor cores first, masked in place on its fp32 fragment (exp of gam_i - gam_j <= 0 only),
    then K K^T: one C x C fp32 fragment live at a time.
  * Occupancy: the launch bounds ask for six blocks per SM (``T.annotate_min_blocks_per_sm``): 80 registers
    (4 bytes of spill without A, none with), where ptxas took 121-125 without them since the TMA loads
    (session 15), i.e. four blocks. H200, session 17, in the API's forward (results/h200/2026-12-02_s17/
    occ-ab.log, one call, us, four -> five blocks: shared memory holds it at five, see below): hk16_hv64
    1x32768 653 -> 614, 8192x4 649 -> 611, hk32_hv32 8192x4 339 -> 314, hk16_hv16 1x32768 (CP) 173 -> 161,
    hk2_hv8 1x32768 (CP) 88 -> 83; o / ht errors unchanged. A block takes its dynamic buffer (36.5 KB), the
    static block (the mbarrier, padded to 1 KB by the dynamic buffer's 1024-byte alignment) and the driver's
    1 KB: 38.5 KB, five blocks in the SM's 228 KB (ncu, session 18: "Block Limit Shared Mem 5", achieved
    occupancy 30.8%). Six need 512 bytes less: beta, gam in the static block's padding (4080257, reverted)
    gave 0-1.5% (session 18, results/h200/2026-12-02_s18/kkt-static-gates*.log): not kept.
  * Every C x C tile moves between registers and shared memory whole: Pm and Ag (Ag formed on Q K^T's dead
    fragment) by stmatrix into swizzled bf16 stage tiles, L = strict_lower(diag(beta) K K^T) by a fragment
    copy, X = 0 by vector fills. ncu on the H200 (session 13, hk16_hv64 1x32768): the kernel was bound by
    shared memory (L1 92.9% busy, 29% of its wavefronts excess), most of it the element-wise 2- and 4-byte
    stores from the fragment layout (eight rows of one column in one bank). Bit-identical Ag and Pm; in
    the API's forward (no A, session 13, results/h200/NOTES.md): 837 -> 682 us at hk16_hv64 1x32768,
    225 -> 182 at hk16_hv16, 115 -> 91 at hk2_hv8. (A tiled CUDA-core 16 -> 32 merge, 4 outputs per
    thread, measured 2 us on top of these and was not kept.)
  * Rows of the chunk are stored as bf16 (row t of A, Ag, Pm holds token t's row of its chunk),
    staged in C x C bf16 shared tiles and written as whole 16-byte row pieces (common/kkt_solve.py
    store_rows): straight from the wgmma fragment / X_s the stores were 2-byte scalars (a third of
    the kernel's sectors excess in ncu); staged, 300 vs 336 us at 1x32768 hk16_hv16, 1122 vs 1272 at
    hk16_hv64 (H200, session 7). The stage tiles take the place of dead buffers (TileLang overlaps
    them by lifetime): the shared memory per block is unchanged.
  * K, Q arrive as TMA boxes of C rows on one mbarrier while the threads load beta and gam; a partial
    chunk's rows past its end are zeroed after they land (the next sequence's tokens or the padding tail:
    NaN there would reach the chunk's rows through the merge products). With the asynchronous loads
    TileLang's default merge no longer overlaps buffers by lifetime (86 KB, two blocks per SM), so the
    kernel is compiled with the aggressive merge, which gives back the element-wise version's layout.
    H200, the API's forward (no A; results/h200/2026-12-02_s15/fwd-split-kkt.log): 681 -> 650 us at hk16_hv64
    1x32768, 182 -> 173 at hk16_hv16 (CP), 91 -> 88 at hk2_hv8 (CP), 349 -> 335 at hk16_hv32.
Shared memory: Q, K 64x128 bf16 (32 KB) + L and X 64x64 fp32 (32 KB) + product scratch 32x32 fp32
(4 KB) + beta, gam + the stage tiles: ~77 KB declared; TileLang overlaps buffers by lifetime: 36.5 KB
dynamic as compiled (tests/kernels/test_kkt_solve_compile.py).
The elementwise steps around the products and the inverse are TileLang macros in common/kkt_solve.py,
shared with blackwell/kkt_solve.py (which keeps common's element-wise load_chunk; this file loads by TMA).
"""

import functools

import tilelang
import tilelang.language as T

from ..common.build import compile_for
from ..common.kkt_solve import build_l, store_a_ag
from ..common.kkt_solve import store_pm as write_pm_rows  # (store_pm is the flag below)
from ..common.smem_layout import swizzled
from ..common.tma_rows import zero_rows_past_end
from ..common.tri_inverse import invert_diag_blocks, merge_32_to_64, merge_pairs


@functools.cache
def kkt_solve_kernel(h_qk: int, h_v: int, K: int, C: int, dtype: str, arch: str, store_a: bool = True,
                     store_pm: bool = True):
    group = h_v // h_qk
    DIAG = 16
    THREADS = 128
    MIN_BLOCKS = 6  # register budget for six blocks per SM (80 registers); shared memory holds it at five (header)
    if C not in (2 * DIAG, 4 * DIAG):
        raise ValueError(f"kkt_solve supports chunk sizes 32 and 64, got {C}")
    n_tok = T.dynamic("n_tok")
    n_chunks = T.dynamic("n_chunks")

    @T.macro
    def load_chunk(q, k, g_cumsum, beta, K_s, Q_s, b_s, gam_s, ld, start, end, by, hk):
        """K (and Q when Pm is stored) rows of the chunk as TMA boxes of C rows (one elected thread; rows past
        a partial chunk's end, the next sequence's tokens or the padding tail, are zeroed after they land: NaN
        there would reach the chunk's own rows through the inverse's merge products), beta (zero past the end)
        and gam (last row repeated) element-wise while the boxes fly."""
        T.tma_copy(k[start:start + C, hk, :], K_s, barrier=ld[0])
        if store_pm:
            T.tma_copy(q[start:start + C, hk, :], Q_s, barrier=ld[0])
        T.mbarrier_arrive(ld[0])
        for i in T.Parallel(C):
            b_s[i] = T.if_then_else(start + i < end, beta[start + i, by], 0.0)
            gam_s[i] = g_cumsum[T.min(start + i, end - 1), by]
        T.mbarrier_wait_parity(ld[0], 0)
        zero_rows_past_end(Q_s if store_pm else None, K_s, start, end, C, K, dtype)  # no Q without Pm
        T.fence_proxy_async()
        T.sync_threads()

    @T.prim_func
    def kkt_solve(
        q: T.Tensor((n_tok, h_qk, K), dtype),
        k: T.Tensor((n_tok, h_qk, K), dtype),
        g_cumsum: T.Tensor((n_tok, h_v), "float32"),
        beta: T.Tensor((n_tok, h_v), "float32"),
        chunk_bounds: T.Tensor((n_chunks, 2), "int32"),
        A: T.Tensor((n_tok, h_v, C), dtype),
        Ag: T.Tensor((n_tok, h_v, C), dtype),
        Pm: T.Tensor((n_tok, h_v, C), dtype),
        scale: T.float32,
    ):
        with T.Kernel(n_chunks, h_v, threads=THREADS) as (c, h):
            T.annotate_min_blocks_per_sm(MIN_BLOCKS)
            K_s = T.alloc_shared((C, K), dtype)
            Q_s = T.alloc_shared((C, K), dtype)
            b_s = T.alloc_shared((C,), "float32")
            gam_s = T.alloc_shared((C,), "float32")
            qkt = T.alloc_fragment((C, C), "float32")
            L_s = T.alloc_shared((C, C), "float32")
            X_s = T.alloc_shared((C, C), "float32")
            kkt = T.alloc_fragment((C, C), "float32")
            M_s = T.alloc_shared((C // 2, C // 2), "float32")
            M_f = T.alloc_fragment((C // 2, C // 2), "float32")
            Pm_s = T.alloc_shared((C, C), dtype)
            A_s = T.alloc_shared((C, C), dtype)
            Ag_s = T.alloc_shared((C, C), dtype)
            x_col = T.alloc_local((DIAG,), "float32")  # invert_diag_blocks' column of X
            ld = T.alloc_barrier([THREADS])  # the K, Q boxes
            tx = T.get_thread_binding()
            T.annotate_layout(swizzled(Pm_s, A_s, Ag_s))  # stage tiles written by stmatrix
            start = chunk_bounds[c, 0]
            end = chunk_bounds[c, 1]
            hk = h // group
            if end > start:
                load_chunk(q, k, g_cumsum, beta, K_s, Q_s, b_s, gam_s, ld, start, end, h, hk)
                if store_pm:
                    # Q K^T and its mask first, so that only one C x C fp32 fragment is live at a time
                    T.gemm(Q_s, K_s, qkt, transpose_B=True, clear_accum=True)
                    write_pm_rows(qkt, gam_s, Pm_s, Pm, scale, start, end, h, C, dtype)
                T.gemm(K_s, K_s, kkt, transpose_B=True, clear_accum=True)
                build_l(kkt, b_s, L_s, X_s, C)
                # 16 x 16 diagonal blocks: forward substitution, one thread per (block, column)
                invert_diag_blocks(L_s, X_s, x_col, tx, C, DIAG)
                # merge by doubling: X21 = -X22 (L21 X11) for every pair of s-blocks
                merge_pairs(L_s, X_s, M_s, tx, C, DIAG, THREADS)  # 16 -> 32
                if C == 4 * DIAG:  # 32 -> 64: two 32 x 32 x 32 products on tensor cores (tf32)
                    merge_32_to_64(L_s, X_s, M_s, M_f, C)
                # Ag on a dead fp32 fragment: Q K^T's, or K K^T's (consumed by build_l) when there is no Q K^T
                if store_pm:
                    store_a_ag(X_s, gam_s, b_s, qkt, A_s, Ag_s, A, Ag, start, end, h, C, dtype, store_a)
                else:
                    store_a_ag(X_s, gam_s, b_s, kkt, A_s, Ag_s, A, Ag, start, end, h, C, dtype, store_a)

    return compile_for(kkt_solve, arch, {tilelang.PassConfigKey.TL_ENABLE_AGGRESSIVE_SHARED_MEMORY_MERGE: True})
