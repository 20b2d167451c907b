"""bwd_fused (prototype) compiles for sm_90a with bwd_chunk's shared-memory layout rules: its two warpgroups run their
chunk loops concurrently in separate branches, so no two buffers may share a byte (TileLang's liveness merge orders
the branches as written), no reduction may need a shared workspace, and everything fits in one block's 227 KB."""

from __future__ import annotations

import re

from qlabench.kernels.hopper.bwd_fused import bwd_fused_kernel

from .test_bwd_chunk_compile import SHARED_LIMIT, SIZES, C, K, V, _overlap


def test_branches_share_no_shared_memory():
    src = bwd_fused_kernel(2, 2, K, V, C, "bfloat16", "sm90").get_kernel_source()
    found = re.findall(r"void\* (\w+) = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)\);", src)
    assert found, "no dynamic shared-memory buffers in the generated CUDA"
    assert not any(name.startswith("workspace") for name, _ in found), "a reduction needs a shared workspace"
    ranges = {name: range(int(off), int(off) + SIZES[name]) for name, off in found}
    assert set(ranges) == set(SIZES)
    clashes = [(a, b) for a in ranges for b in ranges if a < b and _overlap(ranges[a], ranges[b])]
    assert not clashes, f"buffers placed over each other: {clashes}"
    assert max(r.stop for r in ranges.values()) <= SHARED_LIMIT
    assert src.count("threadIdx.x) < 128") == 1  # one branch point, before both chunk loops
    for tile, desc in (("Q_s", "q"), ("K_s", "k"), ("S0_s", "h"), ("V_s", "v"), ("A_s", "A"), ("dO_s", "do")):
        assert re.search(rf"tma_load\({desc}_desc, ld\[\d\], \(&\(\(\(bfloat16_t\*\){tile}\)", src), tile
