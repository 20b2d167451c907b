"""kkt_solve (and bwd_prepare, which forms the same masks) move their C x C tiles between registers and
shared memory whole (session 13: kkt_solve was bound by shared memory, most of it element-wise 2- and
4-byte stores from the fragment layout). These tests compile the Hopper kernels for sm_90a and read the
generated CUDA: the Pm / Ag (and A) stage tiles are written by stmatrix, L by a fragment copy and X by
vector fills, and kkt_solve's buffers still overlap by lifetime so that five blocks fit on an SM by shared
memory; its launch bounds ask for six (session 17: 80 registers instead of the 121-125 ptxas took without
them, four blocks); bwd_prepare's launch bounds ask for three blocks (72 registers instead of 89, two blocks).
"""

from __future__ import annotations

import re

import pytest

from qlabench.kernels.hopper.kkt_solve import kkt_solve_kernel

from .compiled_source import dynamic_shared_memory

C, K = 64, 128
SIZES = {"K_s": C * K * 2, "Q_s": C * K * 2, "L_s": C * C * 4, "X_s": C * C * 4, "M_s": (C // 2) ** 2 * 4,
         "Pm_s": C * C * 2, "A_s": C * C * 2, "Ag_s": C * C * 2, "b_s": C * 4, "gam_s": C * 4}
SM_SHARED = 228 * 1024  # an H200 SM's shared memory (the largest carveout)
BLOCK_OVERHEAD = 1024 + 1024  # per block: the driver's reserved 1 KB, and the static block (the mbarrier) padded
# to 1 KB by the dynamic buffer's __align__(1024)


@pytest.mark.parametrize("store_a", [False, True], ids=["no-A", "with-A"])
def test_tiles_move_whole_and_five_blocks_fit(store_a):
    kernel = kkt_solve_kernel(2, 8, K, C, "bfloat16", "sm90", store_a)
    src = kernel.get_kernel_source()
    assert "__launch_bounds__(128, 6)" in src  # registers for six blocks per SM
    found = dict(re.findall(r"void\* (\w+) = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)\);", src))
    assert found, "no dynamic shared-memory buffers in the generated CUDA"
    end = max(int(off) + SIZES[name] for name, off in found.items())
    smem = dynamic_shared_memory(kernel)
    assert smem == end, (smem, end)
    # five blocks by shared memory (36.5 + 1 + 1 KB each; ncu, session 18: "Block Limit Shared Mem 5"; six,
    # with beta, gam in the static block's padding, measured 0-1.5% faster in session 18: not kept)
    blocks = SM_SHARED // (smem + BLOCK_OVERHEAD)
    assert blocks >= 5, f"{smem} bytes of dynamic shared memory per block: {blocks} blocks per SM"
    # Pm and Ag stage tiles by stmatrix (A, when written, by an element-wise cast from X_s)
    assert src.count("ptx_stmatrix") == 2
    # no 2-byte element-wise stores into the Pm / Ag stage tiles
    assert not re.search(r"\(\(bfloat16_t\*\)(Pm_s|Ag_s)\)\[[^\]]*\] = ", src)
    # X = 0 as 16-byte fills, L copied from the fragment as 8-byte pieces
    assert re.search(r"\*\(float4\*\)\(\(\(float\*\)X_s\)", src)
    assert re.search(r"\*\(float2\*\)\(\(\(float\*\)L_s\)", src)
    # K, Q as TMA boxes on one mbarrier (the aggressive merge keeps the buffers overlapped by lifetime, as
    # the default merge did before the loads became asynchronous)
    assert re.search(r"tma_load\(k_desc, ld\[0\], \(&\(\(\(bfloat16_t\*\)K_s\)", src)
    assert re.search(r"tma_load\(q_desc, ld\[0\], \(&\(\(\(bfloat16_t\*\)Q_s\)", src)


def test_bwd_prepare_masks_leave_registers_whole():
    """bwd_prepare forms Pg and Ag the same way (fragments copied whole into swizzled tiles, then TMA)."""
    from qlabench.kernels.hopper.bwd_prepare import bwd_prepare_kernel

    src = bwd_prepare_kernel(2, 8, K, C, "bfloat16", "sm90").get_kernel_source()
    assert "__launch_bounds__(256, 3)" in src  # registers for three blocks per SM (shared memory allows three)
    assert src.count("ptx_stmatrix") == 2
    assert not re.search(r"\(\(bfloat16_t\*\)(Pg_s|Ag_s)\)\[[^\]]*\] = ", src)
    assert "tma_store(Pg_out_desc" in src and "tma_store(Ag_out_desc" in src
    # one block per (chunk, qk-head): Q, K by TMA once, each v-head's A by TMA on its own phase of ld[1]
    assert re.search(r"tma_load\(q_desc, ld\[0\]", src) and re.search(r"tma_load\(k_desc, ld\[0\]", src)
    assert len(re.findall(r"tma_load\(A_desc, ld\[1\]", src)) == 2  # the group's first v-head, then the next
    assert src.count("tl::wgmma_ss<") == 1 and "for (int j = 0; j < 4; ++j)" in src  # Q K^T once, then the group


@pytest.mark.parametrize("store_a", [False, True], ids=["no-A", "with-A"])
def test_without_pm_no_q(store_a):
    """store_pm False (chunk_fwd_v128 forms Pm on chip): no Q box, no Q K^T, no Pm stage tile or store; Ag still
    leaves by stmatrix, and K rows past a partial chunk's end are still zeroed before K K^T."""
    src = kkt_solve_kernel(2, 8, K, C, "bfloat16", "sm90", store_a, False).get_kernel_source()
    assert "q_desc" not in src and "Pm_s" not in src and "Pm_desc" not in src
    assert src.count("ptx_stmatrix") == 1
    assert src.count("tl::wgmma_ss<") == 1  # K K^T only
    assert re.search(r"tma_load\(k_desc, ld\[0\], \(&\(\(\(bfloat16_t\*\)K_s\)", src)
