"""With one v-head per block, bwd_chunk's two warpgroups run their branches (dq, dk) concurrently, but
TileLang's liveness-based shared-memory merge (which the kernel needs to fit) orders the code as written:
the dq warpgroup's branch, then the dk warpgroup's. It may therefore place a buffer only one branch
touches over a buffer of the other branch. This test compiles the kernel for sm_90a and reads the buffer
offsets from the generated CUDA: no buffer written by one branch before the hand-off barrier may share
bytes with a buffer the other branch touches meanwhile. Under GQA (bwd_chunk_gqa.py) both warpgroups run
their whole v-head loop in their branch: no two buffers may share a byte at all.
"""

from __future__ import annotations

import re

from qlabench.kernels.hopper.bwd_chunk import bwd_chunk_kernel

C, K, V = 64, 128, 128
ROW_TILE = C * K * 2  # bf16 C x K (= C x V)
SIZES = {
    **dict.fromkeys(("Q_s", "K_s", "V_s", "dO_s", "dVp_s", "dv_s", "Vp_s"), ROW_TILE),
    **dict.fromkeys(("S0_s", "dS_s"), K * V * 2),
    **dict.fromkeys(("A_s", "Ag_s", "dP_s", "T1_s", "dAs_s"), C * C * 2),
    "F_s": C * C * 4,
    **dict.fromkeys(("gam_s", "beta_s", "dgu_s", "kt1_s", "sv_s", "dgam_s", "dgq_s", "dgm_s", "dbc_s", "dbr_s"),
                    C * 4),
}
WORKSPACE = 256 * 4  # a cross-thread reduction's scratch: at most one float per thread
# touched by the dq warpgroup's branch / written by it (all before it arrives at the hand-off barrier)
DQ_TOUCHES = {"S0_s", "dS_s", "dO_s", "gam_s", "Q_s", "dgq_s", "dP_s", "K_s", "A_s", "Ag_s", "T1_s",
              "beta_s", "F_s", "dbr_s", "dAs_s"}
DQ_WRITES = {"dgq_s", "T1_s", "F_s", "dbr_s", "dAs_s"}
# touched / written by the dk warpgroup's branch before it waits at the hand-off barrier
DK_TOUCHES = {"Vp_s", "dS_s", "K_s", "gam_s", "kt1_s", "sv_s", "dv_s", "S0_s", "dP_s", "Q_s"}
DK_WRITES = {"kt1_s", "sv_s"}


def shared_ranges(src: str) -> dict[str, range]:
    """Byte range of every dynamic shared-memory buffer the generated CUDA declares."""
    found = re.findall(r"void\* (\w+) = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)\);", src)
    assert found, "no dynamic shared-memory buffers in the generated CUDA"
    out = {}
    for name, offset in found:
        size = WORKSPACE if name.startswith("workspace") else SIZES[name]
        out[name] = range(int(offset), int(offset) + size)
    return out


def _overlap(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


def test_concurrent_branches_never_share_shared_memory():
    src = bwd_chunk_kernel(4, 4, K, V, C, "bfloat16", "sm90").get_kernel_source()
    ranges = shared_ranges(src)
    clashes = []
    for writes, touches in ((DQ_WRITES, DK_TOUCHES), (DK_WRITES, DQ_TOUCHES)):
        for w in writes & ranges.keys():
            clashes += [(w, t) for t in touches & ranges.keys() if t != w and _overlap(ranges[w], ranges[t])]
    assert not clashes, f"buffers placed over each other while both are in use: {clashes}"
    # the hand-off is a named barrier the dq warpgroup arrives at and the dk warpgroup waits on
    assert "__named_barrier_arrive(8, 256)" in src and "__sync_thread_partial(8, 256)" in src


def test_gqa_branches_share_no_shared_memory():
    """Under GQA (bwd_chunk_gqa.py) the whole v-head loop runs inside each warpgroup's branch, so any two
    buffers may be in use at once: the kernel is compiled without the liveness-based merge and no two of
    its buffers may share a byte (and no cross-thread reduction needs a shared workspace)."""
    src = bwd_chunk_kernel(2, 8, K, V, C, "bfloat16", "sm90").get_kernel_source()
    sizes = {**SIZES, "dgu_s": 2 * C * 4}
    found = re.findall(r"void\* (\w+) = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)\);", src)
    assert found and not any(name.startswith("workspace") for name, _ in found)
    ranges = {name: range(int(off), int(off) + sizes[name]) for name, off in found}
    clashes = [(a, b) for a in ranges for b in ranges if a < b and _overlap(ranges[a], ranges[b])]
    assert not clashes, f"buffers placed over each other: {clashes}"
    assert src.count("threadIdx.x) < 128") == 1  # one branch point, before both loops
    # the hand-off and the five per-v-head sync points of the two warpgroups
    assert "__named_barrier_arrive(10, 256)" in src and "__sync_thread_partial(10, 256)" in src
    for bar in (5, 6, 7, 8, 9):
        assert src.count(f"__sync_thread_partial({bar}, 256)") == 2, bar
