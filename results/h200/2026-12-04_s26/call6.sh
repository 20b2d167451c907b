#!/usr/bin/env bash
# Session 26 call 6: A/B of bwd_chunk's staged stores (branch wip/s26-chunk-stores) against main, phase bwd, the
# h200-bwd presets at 8k_1seq, 32k_1seq, 32k_4seq (15 cases): main (07b0b96 = bbd0afb's kernels),
# dqdk (faca682: dq, dk staged), dqdkdv (98cec21: dv staged too). Outputs in one tar.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
root=$PWD; mkdir -p /tmp/s
ab() {  # name commit
  (cd $root/.device/s26/$1 && QLABENCH_GIT_COMMIT=$2 PYTHONPATH=$root/.device/s26/$1:$PYTHONPATH timeout 60 python -m qlabench run \
     --arch sm90 --sweep h200-bwd --phase bwd --seqlens 8k_1seq,32k_1seq,32k_4seq --backends qla --no-progress \
     --out /tmp/s/$1-$3.json > /tmp/s/$1-$3.log 2>&1)
  echo "$1 rc $? at $(el) s"; tar -C /tmp/s -cf $OUT/s.tar .
}
ab main 07b0b96 a
ab dqdk faca682 a
ab dqdkdv 98cec21 a

python - <<'PY' | tee /tmp/s/summary.txt
import json, math
def load(n):
    try:
        return {(r["preset"], r["pattern"]): r for r in json.load(open(f"/tmp/s/{n}.json"))["rows"]}
    except Exception as e:
        print(n, "unreadable", e); return {}
t = {n: load(n) for n in ("main-a", "dqdk-a", "dqdkdv-a")}
for n in ("dqdk-a", "dqdkdv-a"):
    ks = [k for k in t["main-a"] if k in t[n] and t["main-a"][k]["status"] == t[n][k]["status"] == "ok"]
    if ks:
        g = math.exp(sum(math.log(t[n][k]["median_ms"] / t["main-a"][k]["median_ms"]) for k in ks) / len(ks))
        print(f"{n}/main-a geomean {g:.3f} over {len(ks)} ok rows; not ok: {[k for k in t[n] if t[n][k]['status'] != 'ok']}")
for k in t["main-a"]:
    print(k[0], k[1], " ".join(f"{n} {t[n][k]['median_ms']:.3f}" for n in t if k in t[n]))
PY
tar -C /tmp/s -cf $OUT/s.tar . && echo "packed at $(el) s"
