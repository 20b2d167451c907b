"""bwd_chunk's two warpgroups run their whole v-head loops concurrently in separate branches (dq on
warpgroup 0, dk on warpgroup 1), meeting at named barriers. TileLang's liveness-based shared-memory merge
orders code as written (warpgroup 0's loop, then warpgroup 1's), so it could place a buffer one branch
uses over one the concurrent branch uses: the kernel is compiled without it. This test compiles the
kernel for sm_90a and reads the buffer offsets from the generated CUDA: no two buffers may share a byte,
no cross-thread reduction may need a shared workspace, and the branch and barrier structure is the one
the kernel's header describes.
"""

from __future__ import annotations

import re

import pytest

from qlabench.kernels.hopper.bwd_chunk import bwd_chunk_kernel

C, K, V = 64, 128, 128
ROW_TILE = C * K * 2  # bf16 C x K (= C x V)
SIZES = {
    **dict.fromkeys(("Q_s", "K_s", "V_s", "dO_s", "dVp_s", "dU_s", "Vp_s"), ROW_TILE),
    **dict.fromkeys(("S0_s", "dS_s"), K * V * 2),
    **dict.fromkeys(("A_s", "Ag_s", "dP_s"), C * C * 2),
    "F_s": C * (C + 4) * 4,  # rows padded (bwd_chunk.F_PAD)
    "dgu_s": 2 * C * 4,
    **dict.fromkeys(("gam_s", "beta_s", "kt1_s", "sv_s", "dgq_s", "dgm_s", "dbc_s", "dbr_s"), C * 4),
}
SHARED_LIMIT = 227 * 1024


def _overlap(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


def assert_disjoint_shared_tiles(src: str) -> None:
    """The generated CUDA's dynamic shared-memory tiles are exactly SIZES, no two share a byte, none is a reduction's
    workspace, they fit SHARED_LIMIT, and the warpgroups branch once (bwd_chunk and bwd_fused alike)."""
    found = re.findall(r"void\* (\w+) = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)\);", src)
    assert found, "no dynamic shared-memory buffers in the generated CUDA"
    assert not any(name.startswith("workspace") for name, _ in found), "a reduction needs a shared workspace"
    ranges = {name: range(int(off), int(off) + SIZES[name]) for name, off in found}
    assert set(ranges) == set(SIZES)
    clashes = [(a, b) for a in ranges for b in ranges if a < b and _overlap(ranges[a], ranges[b])]
    assert not clashes, f"buffers placed over each other: {clashes}"
    assert max(r.stop for r in ranges.values()) <= SHARED_LIMIT
    assert src.count("threadIdx.x) < 128") == 1  # one branch point, before both loops


@pytest.mark.parametrize("h_qk,h_v", [(4, 4), (2, 8)], ids=["one-v-head", "gqa-4"])
def test_concurrent_branches_share_no_shared_memory(h_qk, h_v):
    src = bwd_chunk_kernel(h_qk, h_v, K, V, C, "bfloat16", "sm90").get_kernel_source()
    assert_disjoint_shared_tiles(src)
    # the seven per-v-head sync points of the two warpgroups (the hand-off, 10, included: warpgroup 0 runs the
    # dg / dbeta tail after it; 14: Ag whole before dv = Ag^T dV'), and X's release (13): warpgroup 1 arrives once
    # it has read X, 0 waits
    for bar in (5, 6, 7, 8, 9, 10, 14):
        assert src.count(f"__sync_thread_partial({bar}, 256)") == 2, bar
    assert src.count("__named_barrier_arrive(13, 256)") == 1 and src.count("__sync_thread_partial(13, 256)") == 1
    # no element-wise step draws a barrier per iteration (an in-place shared-memory update does: W, dU are
    # formed on fragments and copied whole)
    lines = src.splitlines()
    in_loop = [n for n, line in enumerate(lines) if "__sync_thread_partial" in line
               and re.match(r"\s*for \(int i_\w* = 0;", lines[n - 1])]  # first statement of an element loop
    assert not in_loop, [lines[n - 1].strip() for n in in_loop]
    # loads: TMA boxes (Q, K once per block; S0 / V, A, dV' / dO / dS per v-head on four mbarriers),
    # issued by one elected thread, none element-wise from global memory into these tiles
    for tile, desc in (("Q_s", "q"), ("K_s", "k"), ("S0_s", "h"), ("V_s", "v"), ("A_s", "A"),
                       ("dVp_s", "dvp_dv"), ("dO_s", "do"), ("dS_s", "dh")):
        assert re.search(rf"tma_load\({desc}_desc, (ld|ld_qk)\[\d\], \(&\(\(\(bfloat16_t\*\){tile}\)", src), tile
    waits = re.findall(r"ld\[(\d)\]\.wait\(", src)  # both warpgroups wait on S0, V / A / dV', dO; the dk one on dS
    assert sorted(waits) == ["0", "0", "1", "1", "2", "3", "3"], waits
    assert re.search(r"tma_load\(h_desc, ld\[0\]", src)  # S0 alone first: U = K S0 runs while the rest lands
