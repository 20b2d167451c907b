"""V tile of the chunk recurrences: 32, 64 (or, forward on sm90, 128) state columns per block, chosen by
the grid's makespan.

The recurrences (forward chunk_fwd_ws at BV 32 / chunk_fwd_wy at BV 64, backward bwd_h and bwd_dh)
run one block per (sequence or piece, v-head, V tile) that walks every chunk of its chain in order,
and each takes over 113 KB of shared memory: one block per SM. BV = 32 splits a chain over V / 32 =
4 blocks whose chunk step is cheaper than BV = 64's (2 blocks), so it wins while its doubled grid
still finishes first. That depends on the chains' lengths, not only on their count: 28672+4096
tokens over 32 v-heads is 64 long and 64 short chains; at BV 32 the 128 long blocks fill 128 SMs and
the short ones run beside and after them (~470 chunk steps of 1.5 us), at BV 64 each long block sits
alone on its SM for 448 steps of 2.4 us.

Model: blocks are dispatched in grid order (V tile fastest, then v-head, then sequence or piece:
``T.Kernel(NV, N * H_v)``) to whichever SM frees first, each taking its chain's chunk count times
the step time of its tile; the host simulates that list schedule (numbers only, no device access)
and takes the tile with the smaller makespan (32 on a tie). With equal chains this is the wave
count: BV 32 while its grid fits one wave, 64 from one to two waves. A grid of more than
``SIMULATED_WAVES`` waves at BV 32 is throughput-bound and takes 64 without simulating: per state
column BV 64 is the cheaper step (1.77 / 2 < 1.17 forward, 4.68 / 2 < 3.36 backward).
The backward's two recurrences (bwd_h, bwd_dh) run side by side on two streams (streams.py): their blocks
are simulated as one list, bwd_dh's first (its stream is served first).

The step times are H200 measurements (results/h200/NOTES.md: kernel time / chunks of a one-wave grid,
1x32768; backward sessions 7-9; forward session 14 at f5b2dff, chunk_fwd_wy 907 us / 512 chunks at
hk16_hv64, chunk_fwd_ws 597 / 512 at hk16_hv32, was 2.38 and 1.52: no h200-fwd row changes its tile).
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Sequence

# us per chunk step of one block, by V tile
# chunk_fwd_ws, chunk_fwd_wy, chunk_fwd_v128 (sm90 only: forward.forward_value_tile offers 128 where the arch
# has it; never to the CP transition pass). BV 128: H200 session 19, 1577 us / 512 chunks at hk16_hv64
# 1x32768 (one wave) and 789 / 256 at 8192x4 (two waves): 3.08, i.e. 1.54 per 64 columns against wy's 1.77.
# Since it forms Pm itself the step is ~3.22 (825 / 256) and kkt_solve runs without Pm (614 -> 484 us there,
# ~0.5 us per step of that grid): the model's 3.08 sits between the two effects, which it does not model.
FORWARD_STEP_US = {32: 1.17, 64: 1.77, 128: 3.08}
# bwd_dh_ws, bwd_h_ws (one tile serves both): they run side by side (streams.py), bwd_dh_ws's blocks served first.
# bwd_h_ws alone has been faster since session 32 (1.57 / 1.07 at BV 64 / 32). In session 33 the choices were checked
# against forced tiles over h200-bwd phase bwd (results/h200/2026-12-04_s33/call4/): forcing 64 was 1.007x the
# model's time, forcing 32 1.080x. The best of the three was 0.997x, with only hk2_hv4 8k_1seq / 8k_2seq 4% faster
# at 32. So the steps stay.
BACKWARD_STEP_US = {32: (1.66, 1.70), 64: (2.74, 1.94)}
SIMULATED_WAVES = 16


def chain_chunks(bounds: Sequence[tuple[int, ...]] | None, n_chains: int, chunk_size: int) -> tuple[int, ...]:
    """Chunks of each chain of token ranges ``bounds`` ((bos, eos, ...) per sequence or piece: a
    validated call's seq_bounds, a CP plan's pieces); without ``bounds`` (CUDA-graph capture with no
    host values) ``n_chains`` equal chains."""
    if bounds is None:
        return (1,) * n_chains
    return tuple(-(-(b[1] - b[0]) // chunk_size) for b in bounds)


def makespan(chunks: Sequence[int], h_v: int, n_tiles: int, sm_count: int, steps: Sequence[float] = (1,)) -> float:
    """Time until the last block ends when the grid's blocks (``n_tiles`` per (chain, v-head), in grid
    order) are list-scheduled onto ``sm_count`` SMs, one block each; ``steps``: the chunk step of each
    kernel whose grid runs side by side with the others, in the order their blocks are served (the
    default: one kernel, the makespan in chunk steps)."""
    free = [0] * sm_count  # when each SM frees up
    end = 0
    for step in steps:
        for n in chunks:
            for _ in range(h_v * n_tiles):
                t = heapq.heappop(free) + n * step
                end = max(end, t)
                heapq.heappush(free, t)
    return end


@functools.lru_cache(maxsize=256)
def _choose(chunks: tuple[int, ...], h_v: int, sm_count: int, steps: tuple[tuple[int, float], ...],
            V: int) -> int:
    tiles = [bv for bv, _ in steps]
    if len(tiles) == 1:
        return tiles[0]
    narrow = min(tiles)
    if len(chunks) * h_v * (V // narrow) > SIMULATED_WAVES * sm_count:
        return max(tiles)
    cost = {bv: makespan(chunks, h_v, V // bv, sm_count, us if isinstance(us, tuple) else (us,)) for bv, us in steps}
    return min(tiles, key=lambda bv: (cost[bv], bv))


def value_tile(chunks: Sequence[int], h_v: int, sm_count: int, step_us: dict[int, float | tuple[float, ...]],
               V: int = 128) -> int:
    """The V tile (a key of ``step_us``) with the smallest predicted makespan for chains of ``chunks``
    chunks each (one per sequence or piece, `chain_chunks`) over ``h_v`` v-heads on ``sm_count`` SMs.
    A tuple of steps: kernels whose grids run side by side (`makespan`)."""
    if h_v < 1 or sm_count < 1:
        raise ValueError(f"h_v and sm_count must be positive, got {h_v}, {sm_count}")
    return _choose(tuple(int(n) for n in chunks), h_v, sm_count, tuple(sorted(step_us.items())), V)
