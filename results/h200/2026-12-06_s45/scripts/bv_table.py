"""Session 45: the backward's V tile, model (auto, two runs) against forced 32 / 64, per h200-bwd row (call1/)."""
import json
import math
import sys

d = sys.argv[1]


def load(name):
    return {(x["preset"], x["pattern"]): x["median_ms"] for x in json.load(open(f"{d}/{name}.json"))["rows"]
            if x["phase"] == "bwd" and x["status"] == "ok"}


a, a2, b32, b64 = load("hb"), load("hb2"), load("hb_bv32"), load("hb_bv64")
logs = []
print(f"{'preset':10s} {'pattern':9s} {'auto':>7s} {'auto2':>7s} {'bv32':>7s} {'bv64':>7s}  tile  best/auto")
for k in a:
    auto = (a[k] + a2[k]) / 2
    tile = 32 if abs(b32[k] - auto) < abs(b64[k] - auto) else 64  # the forced run auto's time sits next to
    best = min(b32[k], b64[k])
    logs.append(math.log(min(auto, best) / auto))
    print(f"{k[0]:10s} {k[1]:9s} {a[k]:7.4f} {a2[k]:7.4f} {b32[k]:7.4f} {b64[k]:7.4f}  ~{tile}   {best / auto:.3f}")
print(f"geomean of min(auto, best forced) / auto over {len(logs)} rows: {math.exp(sum(logs) / len(logs)):.4f}")
