"""kkt_solve for sm100 / sm103: the two C x C x 128 products on tcgen05 into tensor memory.

Same mathematics, inputs and outputs as hopper/kkt_solve.py (see its header); per (chunk, v-head):
    A_k = (I + strict_lower(diag(beta) K K^T))^{-1}
    Ag  = Gam .* A_k .* beta_col
    Pm  = scale Gam .* Q K^T
What differs on sm100:
  * K K^T and Q K^T (C x C x 128, bf16 operands in shared memory, fp32 accumulate) are issued with
    ``T.tcgen05_gemm`` into two C x C fp32 tensor-memory accumulators (C columns each). Each product
    posts completion to its own mbarrier; the block waits on both (parity 0: one use per block), then
    copies the accumulators tensor memory -> registers (tcgen05.ld) for the elementwise work.
  * The blockwise inverse stays as in Hopper: 16 x 16 diagonal blocks by forward substitution on CUDA
    cores, the 16 -> 32 merge on CUDA cores, the 32 -> 64 merge as two 32 x 32 x 32 fp32 (tf32)
    products with ``T.gemm`` into registers (mma.sync on sm_100a): tcgen05 tiles start at M = 64, and
    these products are 32 rows high. The three inverse steps are the macros of common/tri_inverse.py,
    shared with hopper/kkt_solve.py.
Grid: (NCmax chunks, H_v); blocks past the real chunk count exit. Threads: 128 (one warpgroup: a
64-row tcgen05 accumulator is read back by the four warps of one warpgroup).
Tensor memory: two 32-column allocations (a 64 x 64 fp32 accumulator of the 64-row weight-stationary
atom spans 128 lanes x 32 columns).

Shared memory per block as compiled: 37,376 B (TileLang overlaps buffers by lifetime).

tcgen05 evidence (TileLang 0.1.15, nvcc 13.0, target sm_100a, compiled on a CPU-only machine; never
run on hardware): the generated CUDA calls ``tl::tcgen05mma_ws_ss`` (tcgen05.mma.cta_group::1
.kind::f16, 64-row weight-stationary atoms) for K K^T and Q K^T, ``tl::tcgen05_mma_arrive``
(tcgen05.commit) to the two mbarriers and ``tl::tcgen05_ld_32dp32bNx`` (tcgen05.ld) for the
read-back; ``tl::mma_sync`` remains only in the tf32 inverse merge. SASS (cuobjdump -sass, hk1_hv2
bf16): 32 UTCHMMA.WS, 2 LDTM, 3 UTCBAR, 16 HMMA.1688.F32.TF32 (the merge); the Hopper file compiled
for sm_100a has 32 HMMA.16816.F32.BF16 instead. tests/kernels/test_aot_blackwell.py re-checks the
source on every CI run, and the SASS where cuobjdump + nvdisasm are installed.
The loads and elementwise steps around the products and the inverse are TileLang macros in
common/kkt_solve.py, shared with hopper/kkt_solve.py.
"""

import functools

import tilelang.language as T

from ..common.build import compile_for
from ..common.kkt_solve import build_l, load_chunk, store_a_ag, store_pm
from ..common.smem_layout import swizzled
from ..common.tri_inverse import invert_diag_blocks, merge_32_to_64, merge_pairs


@functools.cache
def kkt_solve_kernel(h_qk: int, h_v: int, K: int, C: int, dtype: str, arch: str, store_a: bool = True):
    group = h_v // h_qk
    DIAG = 16
    THREADS = 128
    if C != 4 * DIAG:
        raise ValueError(f"the sm100 kkt_solve is written for chunk size 64, got {C}")
    n_tok = T.dynamic("n_tok")
    n_chunks = T.dynamic("n_chunks")

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
            K_s = T.alloc_shared((C, K), dtype)
            Q_s = T.alloc_shared((C, K), dtype)
            b_s = T.alloc_shared((C,), "float32")
            gam_s = T.alloc_shared((C,), "float32")
            L_s = T.alloc_shared((C, C), "float32")
            X_s = T.alloc_shared((C, C), "float32")
            M_s = T.alloc_shared((C // 2, C // 2), "float32")
            kkt_t = T.alloc_tmem((C, C), "float32")
            qkt_t = T.alloc_tmem((C, C), "float32")
            kkt = T.alloc_fragment((C, C), "float32")
            qkt = T.alloc_fragment((C, C), "float32")
            M_f = T.alloc_fragment((C // 2, C // 2), "float32")
            Pm_s = T.alloc_shared((C, C), dtype)  # stage tiles of the row stores (common/kkt_solve.py)
            A_s = T.alloc_shared((C, C), dtype)
            Ag_s = T.alloc_shared((C, C), dtype)
            done = T.alloc_barrier([1, 1])  # K K^T, Q K^T complete
            x_col = T.alloc_local((DIAG,), "float32")  # invert_diag_blocks' column of X
            tx = T.get_thread_binding()
            T.annotate_layout(swizzled(Pm_s, A_s, Ag_s))  # stage tiles written by stmatrix
            start = chunk_bounds[c, 0]
            end = chunk_bounds[c, 1]
            hk = h // group
            if end > start:
                load_chunk(q, k, g_cumsum, beta, K_s, Q_s, b_s, gam_s, start, end, h, hk, C, K, dtype)
                # generic-proxy stores above -> async-proxy (tensor core) reads below
                T.fence_proxy_async()
                T.sync_threads()
                T.tcgen05_gemm(K_s, K_s, kkt_t, transpose_B=True, clear_accum=True, mbar=done[0])
                T.tcgen05_gemm(Q_s, K_s, qkt_t, transpose_B=True, clear_accum=True, mbar=done[1])
                T.mbarrier_wait_parity(done[1], 0)
                T.tcgen05_after_thread_sync()
                T.copy(qkt_t, qkt)
                store_pm(qkt, gam_s, Pm_s, Pm, scale, start, end, h, C, dtype)
                T.mbarrier_wait_parity(done[0], 0)
                T.tcgen05_after_thread_sync()
                T.copy(kkt_t, kkt)
                build_l(kkt, b_s, L_s, X_s, C)
                # 16 x 16 diagonal blocks: forward substitution, one thread per (block, column)
                invert_diag_blocks(L_s, X_s, x_col, tx, C, DIAG)
                merge_pairs(L_s, X_s, M_s, tx, C, DIAG, THREADS)  # 16 -> 32, CUDA cores
                # 32 -> 64: X21 = -X22 (L21 X11), two 32 x 32 x 32 fp32 products (mma.sync, tf32)
                merge_32_to_64(L_s, X_s, M_s, M_f, C)
                store_a_ag(X_s, gam_s, b_s, qkt, A_s, Ag_s, A, Ag, start, end, h, C, dtype, store_a)

    return compile_for(kkt_solve, arch)
