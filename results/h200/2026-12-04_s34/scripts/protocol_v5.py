"""Model check of bwd_dh_ws v5's mbarrier protocol: roles as op lists, random interleavings; flags deadlock and
parity aliasing (a wait whose barrier completed two phases past the one it waits for)."""
import random

COUNTS = {"full": 1, "empty": 2, "aux_ready": 1, "s_ready": 1, "v_ready": 1, "h_free": 1,
          "pt_ready": 1, "pt_free": 1, "z_ready": 1, "z_free": 1}


def W(bar, slot, k):  # wait until phase k of (bar, slot) has completed
    return ("wait", bar, slot, k)


def A(bar, slot):
    return ("arrive", bar, slot)


def producer(n):
    ops = []
    for p in range(n // 2 + 1):
        for slot, cr, scr in ((0, 2 * p, 2 * p - 1), (1, 2 * p + 1, 2 * p)):
            if cr < n:
                ops += [W("empty", slot, cr // 2 - 1), A("full", slot)]
            sslot = 1 - slot
            if 0 <= scr < n:
                ops += [W("s_ready", sslot, scr // 2), W("v_ready", sslot, scr // 2), A("h_free", sslot)]
    return ops


def state(n):
    ops = []
    for cr in range(n):
        b = cr % 2
        ops += [W("full", b, cr // 2), W("h_free", b, cr // 2 - 1), A("s_ready", b), W("aux_ready", b, cr // 2),
                W("pt_ready", 0, cr), A("pt_free", 0), A("v_ready", b), W("z_ready", 0, cr), A("z_free", 0),
                A("empty", b)]
    return ops


def aux(n):
    ops = []
    for cr in range(n):
        b = cr % 2
        ops += [W("full", b, cr // 2), A("aux_ready", b), W("pt_free", 0, cr - 1), A("pt_ready", 0),
                A("empty", b), W("z_free", 0, cr - 1), A("z_ready", 0)]
    return ops


def run(n, rng, roles=None, counts=COUNTS):
    """One random interleaving of the roles (name -> op list builder, default v5's) at ``n`` chunks; ``counts``: the
    arrivals that complete a phase of each barrier."""
    progs = {r: build(n) for r, build in (roles or {"producer": producer, "state": state, "aux": aux}).items()}
    pc = {r: 0 for r in progs}
    done = {}  # (bar, slot) -> completed phases
    pend = {}  # (bar, slot) -> arrivals in the current phase
    while True:
        ready = []
        for r, ops in progs.items():
            if pc[r] == len(ops):
                continue
            op = ops[pc[r]]
            if op[0] == "arrive":
                ready.append(r)
            else:
                _, bar, slot, k = op
                n_done = done.get((bar, slot), 0)
                if n_done % 2 != k % 2 if k >= 0 else n_done % 2 == 0:  # the hardware's parity test
                    assert n_done <= k + 1, f"aliasing: {r} waits phase {k} of {bar}[{slot}], {n_done} done"
                    assert n_done >= k + 1, f"early pass: {r} {bar}[{slot}] phase {k}, {n_done} done"
                    ready.append(r)
                else:
                    assert n_done < k + 2, f"missed phase: {r} waits phase {k} of {bar}[{slot}], {n_done} done"
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
            if pend[key] == counts[op[1]]:
                pend[key] = 0
                done[key] = done.get(key, 0) + 1


if __name__ == "__main__":
    rng = random.Random(0)
    for n in range(0, 12):
        for _ in range(3000):
            run(n, rng)
    print("v5 protocol: no deadlock, no parity aliasing over n_chunks 0..11 x 3000 interleavings")
