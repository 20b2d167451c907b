#!/usr/bin/env bash
# Session 27, call 5: fwdbwd of CP_ALPHA_TRAINING 3 (a3) against 6 (a6) on hk4_hv8 and hk2_hv4 (call 4 measured their
# bwd only: a6 0.88-0.96x on their 1-2 sequence rows). One tar.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
root=$PWD; head=$(cat .device/s27/HEAD); mkdir -p /tmp/a5
ab() {  # tree phase cfgs lim
  (cd $root/.device/s27/$1 && QLABENCH_GIT_COMMIT=$head+$1 PYTHONPATH=$root/.device/s27/$1:$PYTHONPATH timeout $4 python -m qlabench run \
     --arch sm90 --sweep h200-bwd --cfg $3 --phase $2 --backends qla --no-progress --out /tmp/a5/$1-$2.json > /tmp/a5/$1-$2.log 2>&1)
  echo "$1 $2 rc $? at $(el) s"; tar -C /tmp/a5 -cf $OUT/a5.tar .
}
ab a3 fwdbwd hk4_hv8,hk2_hv4 45
ab a6 fwdbwd hk4_hv8,hk2_hv4 45
python - <<'PY' | tee /tmp/a5/summary5.txt
import json, math
a = {(r["preset"], r["pattern"]): r for r in json.load(open("/tmp/a5/a3-fwdbwd.json"))["rows"]}
b = {(r["preset"], r["pattern"]): r for r in json.load(open("/tmp/a5/a6-fwdbwd.json"))["rows"]}
ks = [k for k in a if k in b and a[k]["status"] == b[k]["status"] == "ok"]
print(f"fwdbwd a6/a3 geomean {math.exp(sum(math.log(b[k]['median_ms'] / a[k]['median_ms']) for k in ks) / len(ks)):.3f} over {len(ks)}")
for k in ks:
    print(" ", k[0], k[1], f"a3 {a[k]['median_ms']:.3f} a6 {b[k]['median_ms']:.3f} ({b[k]['median_ms'] / a[k]['median_ms']:.3f})", "peak MiB", a[k]["peak_mem_mb"], b[k]["peak_mem_mb"])
PY
tar -C /tmp/a5 -cf $OUT/a5.tar .
