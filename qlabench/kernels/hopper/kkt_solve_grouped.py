"""kkt_solve_grouped: kkt_solve with the GQA group's shared products computed once per (chunk, qk-head).

Opt-in, sm90 with GQA only: KernelOptions.kkt = "grouped" (QLABENCH_KKT=grouped; forward.kkt_role).
tests/kernels/test_kkt_solve_grouped_compile.py compiles it and, on a GPU, runs it against kkt_solve
and the float64 reference; its H200 timings, and why it is not the default, are in
results/h200/NOTES.md.

Formulas: the same as hopper/kkt_solve.py (gam = in-chunk cumsum of g, Gam[i, j] = exp(gam_i - gam_j)
for j <= i else 0), per v-head h of the qk-head hk = h // group:
    A_k = (I + strict_lower(diag(beta_h) K K^T))^{-1}
    Ag  = Gam_h .* A_k .* beta_h col
    Pm  = scale Gam_h .* Q K^T
K K^T and Q K^T depend only on the qk-head, so with GQA (group = h_v / h_qk > 1) every v-head of a
group recomputes the same two 64 x 64 x 128 products from the same Q, K rows in kkt_solve. Here one
block per (chunk, qk-head) loads Q, K once and runs the two wgmma products once, then two serial loops
over the group's v-heads h = hk * group + g:
  1. load gam (and beta) of h, store Pm from the Q K^T fragment (qkt dies after this loop);
  2. load beta, gam of h, build L from K K^T, the blockwise inverse (the unchanged macros of
     common/tri_inverse.py), store A and Ag.
store_pm / build_l / store_a_ag are common/kkt_solve.py's, unchanged (the stores staged through the
tiles Pm_s, A_s, Ag_s; they take the v-head as ``by``; an expression works); the Q / K load and the
per-head beta / gam load are load_chunk's two halves, split out here because this kernel needs them
at different times. Same signature, outputs and row convention as kkt_solve (rows past a sequence end
are not written), so the host swaps them.
K K^T across loop 2: ``kkt_shared`` (default) copies it once to a 64 x 64 fp32 shared tile (exact, the
same fp32 values build_l reads from the fragment in kkt_solve); ``kkt_shared=False`` keeps it in the
wgmma fragment (32 registers per thread live across the loop). Compiled for sm_90a (cuobjdump
-res-usage, TileLang 0.1.15, any group, split 1 or 2):
      kkt_shared   70,144 B dynamic smem, 128 registers, LOCAL:0  -> 3 blocks (12 warps) per SM
      fragment     53,760 B dynamic smem, 156-158 registers, LOCAL:0 -> 3 blocks (12 warps) per SM
      (kkt_solve   37,376 B, 96 registers -> 5 blocks per SM)
  Since session 7 both include the three 8 KB bf16 stage tiles of common/kkt_solve.py's row stores,
  which kkt_solve overlaps with dead buffers and this kernel's v-head loops do not: kkt_shared lost
  its fourth block per SM. The register-column diagonal inverse kkt_solve uses would take 194
  registers here, so this kernel keeps the row-by-row one (in_registers=False). Its timings in
  NOTES.md predate both and kkt_solve's own 25% since; not re-measured.
  The fragment version's registers are not the fragments alone: a one-iteration loop (group 1)
  compiles to 93; ptxas keeps more live across a real loop. Which one wins is for the GPU to say
  (tools: call the factory with kkt_shared=False); forward.py takes the default.

Grid: (NCmax chunks, H_qk * split); blocks past the real chunk count exit. Block (c, y) takes qk-head
hk = y // split and v-heads hk * group + (y % split) * (group / split) + [0, group / split): split = 1
(the default) is the whole group per block; split = 2 (group even) halves it for grids too small to
fill the GPU (forward.kkt_group_split), each half recomputing the two products.
Threads: 128 (one warpgroup), as kkt_solve.
Shared memory: Q, K 64x128 bf16 (32 KB, dead after the products; TileLang overlaps L_s, X_s or
kkt_s, b_s with them), L and X 64x64 fp32 (32 KB), kkt_s 64x64 fp32 (16 KB, kkt_shared only), M_s
32x32 fp32 (4 KB), beta, gam (512 B), the Pm / A / Ag stage tiles 3 x 8 KB: the numbers above; the
compile test bounds them (227 KB per block; 3 blocks per SM).
Barriers across loop iterations: each loop body starts with a block barrier, so v-head g + 1's writes
of b_s, gam_s (its load) and of L_s, X_s (build_l) wait until every thread finished reading them in
v-head g's last step (store_pm / store_a_ag), and loop 2's first iteration waits for loop 1's reads
of gam_s; a second barrier follows each beta / gam load. TileLang adds the one between the products
(reading K_s) and the kkt_s copy that overlaps K_s. The macros' own barriers order the steps inside
one v-head. The compile test checks these in the generated CUDA.

Expected gain (the reasoning behind the kernel; the measurements are in NOTES.md): per (chunk, v-head) kkt_solve loads 2 x 16 KB of Q, K and
runs 2 x 1 MFLOP of wgmma besides the inverse; with group 4 the grouped kernel does that once per 4
v-heads, so global loads of Q, K drop 4x (H200 1x32768 hk16_hv64: 1.29 ms for kkt_solve, 29-44% of
the forward) and the wgmma time 4x; the inverse and the A / Ag / Pm stores (the CUDA-core part, which
ncu showed as the bound: shared-memory traffic) stay per v-head. Against that: 4 resident blocks per
SM instead of kkt_solve's 5 (registers / shared memory above) to hide the inverse's serial chains, and
one block's critical path group-fold longer. A guess of 10-25% off kkt_solve at group 4 on large grids,
less at group 2, possibly a loss on small grids (split = 2 there); nothing at group 1 (the host keeps
kkt_solve). The v-head loops are emitted with ``#pragma unroll 1`` (T.unroll(..., unroll_factor=1)):
unrolling the inverse 2-4 times would only grow the code (it did not change the registers).
"""

import functools

import tilelang.language as T

from ..common.build import compile_for
from ..common.kkt_solve import build_l, store_a_ag, store_pm
from ..common.tri_inverse import invert_diag_blocks, merge_32_to_64, merge_pairs


@T.macro
def load_qk(q, k, K_s, Q_s, start, end, hk, C: int, K: int, dtype: str):
    """K, Q rows of the chunk of qk-head hk (zero past its end): load_chunk's first half."""
    for i, d in T.Parallel(C, K):
        K_s[i, d] = T.if_then_else(start + i < end, k[start + i, hk, d], T.cast(0, dtype))
        Q_s[i, d] = T.if_then_else(start + i < end, q[start + i, hk, d], T.cast(0, dtype))


@T.macro
def load_beta_gam(g_cumsum, beta, b_s, gam_s, start, end, by, C: int):
    """beta (zero past the chunk end) and gam (last row repeated) of v-head ``by``: load_chunk's second half."""
    for i in T.Parallel(C):
        b_s[i] = T.if_then_else(start + i < end, beta[start + i, by], 0.0)
        gam_s[i] = g_cumsum[T.min(start + i, end - 1), by]


@functools.cache
def kkt_solve_grouped_kernel(h_qk: int, h_v: int, K: int, C: int, dtype: str, arch: str, split: int = 1,
                             kkt_shared: bool = True):
    group = h_v // h_qk
    DIAG = 16
    THREADS = 128
    if C not in (2 * DIAG, 4 * DIAG):
        raise ValueError(f"kkt_solve_grouped supports chunk sizes 32 and 64, got {C}")
    if h_v % h_qk or split < 1 or group % split:
        raise ValueError(f"kkt_solve_grouped: h_v {h_v} must be a multiple of h_qk {h_qk} and the group "
                         f"{group} a multiple of split {split}")
    per_block = group // split
    n_tok = T.dynamic("n_tok")
    n_chunks = T.dynamic("n_chunks")

    @T.prim_func
    def kkt_solve_grouped(
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
        with T.Kernel(n_chunks, h_qk * split, threads=THREADS) as (c, y):
            K_s = T.alloc_shared((C, K), dtype)
            Q_s = T.alloc_shared((C, K), dtype)
            b_s = T.alloc_shared((C,), "float32")
            gam_s = T.alloc_shared((C,), "float32")
            qkt = T.alloc_fragment((C, C), "float32")
            L_s = T.alloc_shared((C, C), "float32")
            X_s = T.alloc_shared((C, C), "float32")
            kkt = T.alloc_fragment((C, C), "float32")
            kkt_s = T.alloc_shared((C, C) if kkt_shared else (1, 1), "float32")
            M_s = T.alloc_shared((C // 2, C // 2), "float32")
            M_f = T.alloc_fragment((C // 2, C // 2), "float32")
            Pm_s = T.alloc_shared((C, C), dtype)  # stage tiles of the row stores (common/kkt_solve.py)
            A_s = T.alloc_shared((C, C), dtype)
            Ag_s = T.alloc_shared((C, C), dtype)
            x_acc = T.alloc_local((1,), "float32")  # invert_diag_blocks' running sum (in_registers=False)
            tx = T.get_thread_binding()
            start = chunk_bounds[c, 0]
            end = chunk_bounds[c, 1]
            hk = y // split
            h0 = hk * group + (y % split) * per_block
            if end > start:
                load_qk(q, k, K_s, Q_s, start, end, hk, C, K, dtype)
                T.gemm(K_s, K_s, kkt, transpose_B=True, clear_accum=True)
                T.gemm(Q_s, K_s, qkt, transpose_B=True, clear_accum=True)
                if kkt_shared:  # K K^T to shared memory: no fragment live across the inverse loop
                    T.copy(kkt, kkt_s)
                # Pm of every v-head first, so that qkt is dead before the inverse loop
                for g in T.unroll(per_block, unroll_factor=1):
                    T.sync_threads()  # gam_s of v-head g - 1 read by every thread
                    load_beta_gam(g_cumsum, beta, b_s, gam_s, start, end, h0 + g, C)
                    T.sync_threads()
                    store_pm(qkt, gam_s, Pm_s, Pm, scale, start, end, h0 + g, C, dtype)
                for g in T.unroll(per_block, unroll_factor=1):
                    # v-head g - 1's store_a_ag (at g = 0: the Pm loop's reads of gam_s and the products'
                    # reads of K_s, Q_s, which L_s, X_s overlap) done before b_s, gam_s, L_s, X_s are rewritten
                    T.sync_threads()
                    load_beta_gam(g_cumsum, beta, b_s, gam_s, start, end, h0 + g, C)
                    T.sync_threads()
                    if kkt_shared:
                        build_l(kkt_s, b_s, L_s, X_s, C)
                    else:
                        build_l(kkt, b_s, L_s, X_s, C)
                    # 16 x 16 diagonal blocks: forward substitution, one thread per (block, column)
                    invert_diag_blocks(L_s, X_s, x_acc, tx, C, DIAG, in_registers=False)
                    # merge by doubling: X21 = -X22 (L21 X11) for every pair of s-blocks
                    merge_pairs(L_s, X_s, M_s, tx, C, DIAG, THREADS)  # 16 -> 32
                    if C == 4 * DIAG:  # 32 -> 64: two 32 x 32 x 32 products on tensor cores (tf32)
                        merge_32_to_64(L_s, X_s, M_s, M_f, C)
                    store_a_ag(X_s, gam_s, b_s, A_s, Ag_s, A, Ag, start, end, h0 + g, C, dtype)

    return compile_for(kkt_solve_grouped, arch)
