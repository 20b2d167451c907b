#!/usr/bin/env bash
# Prepared in session 26 for the next device session (results/h200/NOTES.md, "session 26's view", item 0).
# A/B over h200-bwd's 40 cases (phase bwd): main (07b0b96 = bbd0afb's kernels), dqdkdv (98cec21: bwd_chunk's
# dq, dk, dv stores staged through shared memory; call 6 measured 0.935x on 15 cases), fpad (40ff3f2: + F_s rows
# padded, not measured), cpscratch (df3c3ce, branch wip/s26-cp-scratch: main's kernels, the CP M pass's dO = 0 in dv's
# rows; for peak memory). Trees under .device/s26/ (git archive); their kernels for the six presets and the GPU
# tests' configurations are compiled into .device/tlcache (repack it first). Outputs in one tar, appended after
# each run. Then, in a second call right after (warm), the GPU suite on the tree kept (check out its commit first).
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
root=$PWD; mkdir -p /tmp/n
ab() {  # tree commit
  (cd $root/.device/s26/$1 && QLABENCH_GIT_COMMIT=$2 PYTHONPATH=$root/.device/s26/$1:$PYTHONPATH timeout 110 python -m qlabench run \
     --arch sm90 --sweep h200-bwd --phase bwd --backends qla --no-progress --out /tmp/n/$1.json > /tmp/n/$1.log 2>&1)
  echo "$1 rc $? at $(el) s"; tar -C /tmp/n -cf $OUT/n.tar .
}
ab main 07b0b96
ab dqdkdv 98cec21
ab fpad 40ff3f2
ab cpscratch df3c3ce
python - <<'PY' | tee /tmp/n/summary.txt
import json, math
def load(n):
    try:
        return {(r["preset"], r["pattern"]): r for r in json.load(open(f"/tmp/n/{n}.json"))["rows"]}
    except Exception as e:
        print(n, "unreadable", e); return {}
t = {n: load(n) for n in ("main", "dqdkdv", "fpad", "cpscratch")}
for n in ("dqdkdv", "fpad", "cpscratch"):
    ks = [k for k in t["main"] if k in t[n] and t["main"][k]["status"] == t[n][k]["status"] == "ok"]
    if ks:
        g = math.exp(sum(math.log(t[n][k]["median_ms"] / t["main"][k]["median_ms"]) for k in ks) / len(ks))
        print(f"{n}/main geomean {g:.3f} over {len(ks)} ok rows; not ok: {[k for k in t[n] if t[n][k]['status'] != 'ok']}")
for k in t["main"]:
    print(k[0], k[1], " ".join(f"{n} {t[n][k]['median_ms']:.3f}" for n in t if k in t[n]),
          " peak MiB main / cpscratch:", t["main"][k]["peak_mem_mb"], t["cpscratch"].get(k, {}).get("peak_mem_mb"))
PY
tar -C /tmp/n -cf $OUT/n.tar . && echo "packed at $(el) s"
