"""Model check of bwd_h_ws htma's mbarrier protocol (the producer stores h[c - 1] by TMA after its loads of c), as
protocol_v5.py: roles as op lists, random interleavings; flags deadlock and parity aliasing."""
import random

from protocol_v5 import A, W

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


def run(n, rng):
    progs = {"producer": producer(n), "state": state(n), "transition": transition(n)}
    pc = {r: 0 for r in progs}
    done, pend = {}, {}
    while True:
        ready = []
        for r, ops in progs.items():
            if pc[r] == len(ops):
                continue
            op = ops[pc[r]]
            if op[0] == "arrive":
                ready.append(r)
                continue
            _, bar, slot, k = op
            n_done = done.get((bar, slot), 0)
            if n_done % 2 != k % 2:
                assert n_done == k + 1, f"aliasing or early pass: {r} {op}, {n_done} done"
                ready.append(r)
            else:
                assert n_done < k + 2, f"missed phase: {r} {op}, {n_done} done"
        if not ready:
            left = {r: progs[r][pc[r]] for r in progs if pc[r] < len(progs[r])}
            assert not left, f"deadlock at n={n}: {left}"
            return
        r = rng.choice(ready)
        op = progs[r][pc[r]]
        pc[r] += 1
        if op[0] == "arrive":
            key = (op[1], op[2])
            pend[key] = pend.get(key, 0) + 1
            if pend[key] == COUNTS[op[1]]:
                pend[key] = 0
                done[key] = done.get(key, 0) + 1


if __name__ == "__main__":
    rng = random.Random(1)
    for n in range(12):
        for _ in range(3000):
            run(n, rng)
    print("htma protocol: no deadlock, no parity aliasing over n_run 0..11 x 3000 interleavings")
