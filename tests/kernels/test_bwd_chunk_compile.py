"""With one v-head per block, bwd_chunk's two warpgroups run their branches (dq, dk) concurrently, but
TileLang's liveness-based shared-memory merge (which the kernel needs to fit) orders the code as written:
the dq warpgroup's branch, then the dk warpgroup's. It may therefore place a buffer only one branch
touches over a buffer of the other branch. This test compiles the kernel for sm_90a and reads the buffer
offsets from the generated CUDA: no buffer written by one branch before the hand-off barrier may share
bytes with a buffer the other branch touches meanwhile. Under GQA the kernel keeps the lockstep tail
(both warpgroups on every GEMM, no branches, no hand-off).
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


def test_gqa_keeps_the_lockstep_tail():
    src = bwd_chunk_kernel(2, 8, K, V, C, "bfloat16", "sm90").get_kernel_source()
    assert "__named_barrier_arrive" not in src and "threadIdx.x) < 128" not in src
