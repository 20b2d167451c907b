"""The two V tiles of one chain as a thread-block cluster: the ring tiles both blocks read, once, by TMA multicast.

The chunk recurrences (chunk_fwd_wy, bwd_h_ws, bwd_dh_ws) run one block per (sequence or piece, v-head, V tile);
at BV = 64 the chain's two blocks load the same K, Q and C x C tiles (and factor rows) every chunk and differ
only in their V / dO columns. Launched as a cluster of those two blocks (``LAUNCH``: cluster_dims (2, 1, 1)
over the grid's V-tile axis), rank 0 issues each shared tile once as a multicast into the same ring slot of
both blocks (``T.tma_copy(..., cluster_mask=MASK)``; each block still expects the bytes on its own full
barrier, rank 1 issues nothing), so those tiles cross the L2 once per chain instead of twice.

The multicast writes rank 1's slot too, so rank 0 may issue it only once both blocks have freed the slot:
each producer, past its own empty[slot] wait, arrives on rank 0's ``pair_empty[slot]`` (a cluster barrier of
count 2, one elected thread per block), and rank 0's producer waits on it (``claim_slot``). A multicast that
lands in rank 1 before rank 1's producer has posted its expected bytes only drives that barrier's transaction
count negative for a moment (the phase cannot complete before the producer's own arrival). TileLang syncs
the cluster after the barriers' initialisation; ``finish`` syncs it again before either block exits, so no
block leaves while its peer may still arrive on its barriers.
"""

import os

import tilelang.language as T

LAUNCH = {"cluster_dims": (2, 1, 1)}
MASK = 0b11  # both ranks of the pair receive the multicast
RANKS = 2


def pairs(n_tiles: int) -> bool:
    """Whether a recurrence of ``n_tiles`` V tiles per chain runs as clusters of two (QLABENCH_CLUSTER_PAIR=0:
    never, the A/B switch)."""
    return n_tiles == RANKS and os.environ.get("QLABENCH_CLUSTER_PAIR", "1") != "0"


@T.macro
def claim_slot(pair_empty, slot: int, use, tx):
    """After the block's own empty[slot] wait for its ``use``-th fill of ``slot``: both producers report the
    slot free on rank 0's pair_empty[slot]; rank 0 waits for both before it multicasts into it."""
    if tx == 0:
        T.mbarrier_arrive(pair_empty[slot], 0)
    if T.block_rank_in_cluster() == 0:
        T.mbarrier_wait_parity(pair_empty[slot], use & 1)


@T.macro
def finish():
    """Every thread of both blocks, after their roles: neither exits while its peer may still touch it."""
    T.cluster_sync()
