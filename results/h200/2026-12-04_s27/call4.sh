#!/usr/bin/env bash
# Session 27, call 4: the CP piece length of training forwards (kernels/__init__.CP_ALPHA_TRAINING) 3 (a3, 1517bef's
# plans) against 6 (a6: pieces twice as long) on h200-bwd's CP presets, phases bwd and fwdbwd; then the GPU suite on
# the checkout with the winner applied (a6 kept iff bwd geomean <= 0.99 and fwdbwd geomean <= 1.0). One tar, appended.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
root=$PWD; head=$(cat .device/s27/HEAD); mkdir -p /tmp/a
ab() {  # tree phase cfgs lim
  (cd $root/.device/s27/$1 && QLABENCH_GIT_COMMIT=$head+$1 PYTHONPATH=$root/.device/s27/$1:$PYTHONPATH timeout $4 python -m qlabench run \
     --arch sm90 --sweep h200-bwd --cfg $3 --phase $2 --backends qla --no-progress --out /tmp/a/$1-$2.json > /tmp/a/$1-$2.log 2>&1)
  echo "$1 $2 rc $? at $(el) s"; tar -C /tmp/a -cf $OUT/a.tar .
}
ab a3 bwd hk16_hv16,hk8_hv16,hk4_hv8,hk2_hv4 80
ab a6 bwd hk16_hv16,hk8_hv16,hk4_hv8,hk2_hv4 80
ab a3 fwdbwd hk16_hv16,hk8_hv16 60
ab a6 fwdbwd hk16_hv16,hk8_hv16 60
python - <<'PY' | tee /tmp/a/summary.txt
import json, math
def load(n):
    try:
        return {(r["preset"], r["pattern"]): r for r in json.load(open(f"/tmp/a/{n}.json"))["rows"]}
    except Exception as e:
        print(n, "unreadable", e); return {}
keep = True
for ph in ("bwd", "fwdbwd"):
    a, b = load(f"a3-{ph}"), load(f"a6-{ph}")
    ks = [k for k in a if k in b and a[k]["status"] == b[k]["status"] == "ok"]
    g = math.exp(sum(math.log(b[k]["median_ms"] / a[k]["median_ms"]) for k in ks) / len(ks)) if ks else 9
    print(f"{ph}: a6/a3 geomean {g:.3f} over {len(ks)} ok rows; not ok: {[k for k in b if b[k]['status'] != 'ok']}")
    keep = keep and g <= (0.99 if ph == "bwd" else 1.0) and len(ks) == len(a)
    for k in a:
        if k in b:
            print(" ", ph, k[0], k[1], f"a3 {a[k]['median_ms']:.3f} a6 {b[k]['median_ms']:.3f} ({b[k]['median_ms'] / a[k]['median_ms']:.3f})",
                  "peak MiB", a[k]["peak_mem_mb"], b[k]["peak_mem_mb"])
print("KEEP a6" if keep else "KEEP a3")
open("/tmp/a/keep", "w").write("a6" if keep else "a3")
PY
tar -C /tmp/a -cf $OUT/a.tar .
if [ "$(cat /tmp/a/keep)" = a6 ]; then sed -i 's/^CP_ALPHA_TRAINING = 3.0/CP_ALPHA_TRAINING = 6.0/' qlabench/kernels/__init__.py; fi
grep -n "^CP_ALPHA_TRAINING" qlabench/kernels/__init__.py
echo "suite starts at $(el) s"
bash .device/gpu-tests > $OUT/gpu-tests.log 2>&1; echo "suite rc $? at $(el) s"
grep -E "^tests/|^FAILED|^ERROR" $OUT/gpu-tests.log | tail -30
