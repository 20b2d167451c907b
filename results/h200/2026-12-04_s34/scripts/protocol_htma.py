"""Model check of bwd_h_ws htma's mbarrier protocol (the producer stores h[c - 1] by TMA after its loads of c), as
protocol_v5.py (its run(): random interleavings; flags deadlock and parity aliasing)."""
import random

from protocol_v5 import A, W, run

COUNTS = {"full": 1, "empty": 2, "s_ready": 1, "h_free": 1, "x_ready": 1, "x_free": 1}


def producer(n):
    ops = []
    for p in range(n // 2 + 1):
        for slot, c, sc in ((0, 2 * p, 2 * p - 1), (1, 2 * p + 1, 2 * p)):
            if c < n:
                ops += [W("empty", slot, c // 2 - 1), A("full", slot)]
            if 0 <= sc < n:
                ops += [W("s_ready", 1 - slot, sc // 2), A("h_free", 1 - slot)]
    return ops


def state(n):
    ops = []
    for c in range(n):
        b = c % 2
        ops += [W("full", b, c // 2), W("h_free", b, c // 2 - 1), A("s_ready", b), W("x_ready", b, c // 2),
                A("x_free", b), A("empty", b)]
    return ops


def transition(n):
    ops = []
    for c in range(n):
        b = c % 2
        ops += [W("full", b, c // 2), W("x_free", b, c // 2 - 1), A("x_ready", b), A("empty", b)]
    return ops


if __name__ == "__main__":
    rng = random.Random(1)
    for n in range(12):
        for _ in range(3000):
            run(n, rng, {"producer": producer, "state": state, "transition": transition}, COUNTS)
    print("htma protocol: no deadlock, no parity aliasing over n_run 0..11 x 3000 interleavings")
