"""bwd_fused compiles for sm_90a with bwd_chunk's shared-memory layout rules: its two warpgroups run their chunk loops
concurrently in separate branches, so no two buffers may share a byte (TileLang's liveness merge orders the branches
as written), no reduction may need a shared workspace, and everything fits in one block's 227 KB."""

from __future__ import annotations

import re

from qlabench.kernels.hopper.bwd_fused import bwd_fused_kernel

from .test_bwd_chunk_compile import C, K, V, assert_disjoint_shared_tiles


def test_branches_share_no_shared_memory():
    src = bwd_fused_kernel(2, 2, K, V, C, "bfloat16", "sm90").get_kernel_source()
    assert_disjoint_shared_tiles(src)
    for tile, desc in (("Q_s", "q"), ("K_s", "k"), ("S0_s", "h"), ("V_s", "v"), ("A_s", "A"), ("dO_s", "do")):
        assert re.search(rf"tma_load\({desc}_desc, ld\[\d\], \(&\(\(\(bfloat16_t\*\){tile}\)", src), tile
