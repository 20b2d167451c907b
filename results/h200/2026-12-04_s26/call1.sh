#!/usr/bin/env bash
# Prepared in session 25 for the next device session (see results/h200/NOTES.md, "session 25's view").
# A/B over h200-bwd's 40 cases (phase bwd), four trees, each run with QLABENCH_GIT_COMMIT set:
#   main = the checkout (HEAD), lptplain = wip/s25-lpt-e1 2c4ea2a, prefetch = wip/s25-chunk-prefetch 4f88295,
#   persistent = wip/s25-chunk-persistent bb0aaf4 (trees under .device/s26/, made by `git archive <rev> qlabench configs`;
#   their kernels were compiled on the CPU into .device/tlcache in session 25: repack it first).
# Outputs go into one tar (a call returns at most 8 files). Carry: gpu-env.sh, the bundle, gpu-tests,
# tlcache.tar.xz, .device/s26. Then, in a second call right after (warm), the GPU suite on the tree kept.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
root=$PWD; mkdir -p /tmp/ab
ab() {  # name dir commit
  (cd $2 && QLABENCH_GIT_COMMIT=$3 PYTHONPATH=$2:$PYTHONPATH timeout 110 python -m qlabench run --arch sm90 \
     --sweep h200-bwd --phase bwd --backends qla --no-progress --out /tmp/ab/ab-$1.json > /tmp/ab/ab-$1.log 2>&1)
  echo "$1 rc $? at $(el) s"
}
ab main $root $(git -C $root rev-parse --short HEAD 2>/dev/null || echo main)
ab lptplain $root/.device/s26/lptplain 2c4ea2a
ab prefetch $root/.device/s26/prefetch 4f88295
ab persistent $root/.device/s26/persistent bb0aaf4
ab main2 $root $(git -C $root rev-parse --short HEAD 2>/dev/null || echo main)
python - <<'PY' | tee /tmp/ab/summary.txt
import json, math
def load(n):
    try:
        return {(r["preset"], r["pattern"]): r for r in json.load(open(f"/tmp/ab/ab-{n}.json"))["rows"]}
    except Exception as e:
        print(n, "unreadable", e); return {}
t = {n: load(n) for n in ("main", "lptplain", "prefetch", "persistent", "main2")}
for n in ("lptplain", "prefetch", "persistent", "main2"):
    ks = [k for k in t["main"] if k in t[n] and t["main"][k]["status"] == t[n][k]["status"] == "ok"]
    if ks:
        g = math.exp(sum(math.log(t[n][k]["median_ms"] / t["main"][k]["median_ms"]) for k in ks) / len(ks))
        print(f"{n}/main geomean {g:.3f} over {len(ks)} ok rows; not ok: {[k for k in t[n] if t[n][k]['status'] != 'ok']}")
for k in t["main"]:
    print(k[0], k[1], " ".join(f"{n} {t[n][k]['median_ms']:.3f}" for n in t if k in t[n]))
PY
tar -C /tmp/ab -cf $OUT/ab.tar . && echo "packed at $(el) s"
