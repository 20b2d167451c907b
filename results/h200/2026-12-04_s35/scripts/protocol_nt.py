"""Model check of bwd_dh_ws nt's mbarrier protocol (session 35: v5 with the dh / dV' row stores back on the aux
warpgroup, after its z_ready; the producer only loads), with session 34's protocol_v5.run (random interleavings;
flags deadlock and parity aliasing). Run from this folder with ../../2026-12-04_s34/scripts on PYTHONPATH."""
import random

from protocol_v5 import COUNTS, A, W, run, state
from protocol_v5 import aux as aux_v5


def producer(n):
    ops = []
    for cr in range(n):
        ops += [W("empty", cr % 2, cr // 2 - 1), A("full", cr % 2)]
    return ops


def aux(n):
    """v5's aux (protocol_v5.aux) with each chunk's row stores after its z_ready arrive."""
    ops, cr = [], 0
    for op in aux_v5(n):
        ops.append(op)
        if op == A("z_ready", 0):
            ops += [W("s_ready", cr % 2, cr // 2), W("v_ready", cr % 2, cr // 2), A("h_free", cr % 2)]
            cr += 1
    return ops


if __name__ == "__main__":
    rng = random.Random(2)
    for n in range(12):
        for _ in range(3000):
            run(n, rng, {"producer": producer, "state": state, "aux": aux}, COUNTS)
    print("nt protocol: no deadlock, no parity aliasing over n_chunks 0..11 x 3000 interleavings")
    # a mutation must be caught: the aux's h_free arrive dropped -> the state's h_free wait of chunk 2 deadlocks
    def aux_bad(n):
        return [op for op in aux(n) if op != A("h_free", 0)]
    try:
        run(4, rng, {"producer": producer, "state": state, "aux": aux_bad}, COUNTS)
    except AssertionError as e:
        print(f"mutation caught: {e}")
    else:
        raise SystemExit("mutation not caught")
