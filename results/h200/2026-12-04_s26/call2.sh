#!/usr/bin/env bash
# Session 26 call 2: A/B over h200-bwd's 40 cases (phase bwd) of lpt (b3aedd8: the longest-first plain path,
# tree under .device/s26/lpt) against the checkout (dv formed in bwd_chunk over dV' in place), then, on the
# checkout, the fwdbwd phase and the per-kernel split at 1x32768 hk16_hv16 / hk16_hv64. Outputs in one tar.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
root=$PWD; mkdir -p /tmp/r
head=$(cat .device/s26/HEAD)
run() {  # name dir commit timeout args...
  local name=$1 dir=$2 commit=$3 lim=$4; shift 4
  (cd $dir && QLABENCH_GIT_COMMIT=$commit PYTHONPATH=$dir:$PYTHONPATH timeout $lim python -m qlabench run --arch sm90 \
     --backends qla --no-progress --out /tmp/r/$name.json "$@" > /tmp/r/$name.log 2>&1)
  echo "$name rc $? at $(el) s"
}
run lpt $root/.device/s26/lpt b3aedd8 110 --sweep h200-bwd --phase bwd
run dvin $root $head 110 --sweep h200-bwd --phase bwd
run dvin-fwdbwd $root $head 150 --sweep h200-bwd --phase fwdbwd
run dvin-split $root $head 100 --cfg hk16_hv16,hk16_hv64 --seqlens 1x32768 --phase bwd --kernel-split
python - <<'PY' | tee /tmp/r/summary.txt
import json, math
def load(n):
    try:
        return {(r["preset"], r["pattern"]): r for r in json.load(open(f"/tmp/r/{n}.json"))["rows"]}
    except Exception as e:
        print(n, "unreadable", e); return {}
a, b = load("lpt"), load("dvin")
ks = [k for k in a if k in b and a[k]["status"] == b[k]["status"] == "ok"]
if ks:
    g = math.exp(sum(math.log(b[k]["median_ms"] / a[k]["median_ms"]) for k in ks) / len(ks))
    m = math.exp(sum(math.log(b[k]["peak_mem_mb"] / a[k]["peak_mem_mb"]) for k in ks) / len(ks))
    print(f"dvin/lpt time geomean {g:.3f}, peak memory geomean {m:.3f} over {len(ks)} ok rows")
print("not ok:", [(k, r["status"]) for k, r in b.items() if r["status"] != "ok"], [(k, r["status"]) for k, r in a.items() if r["status"] != "ok"])
for k in a:
    if k in b:
        print(k[0], k[1], f"lpt {a[k]['median_ms']:.3f} {a[k]['peak_mem_mb']:.0f} MiB  dvin {b[k]['median_ms']:.3f} {b[k]['peak_mem_mb']:.0f} MiB")
for n in ("dvin-fwdbwd", "dvin-split"):
    t = load(n)
    print(n, len(t), "rows, not ok:", [(k, r["status"]) for k, r in t.items() if r["status"] != "ok"])
for k, r in load("dvin-split").items():
    print(k, r["median_ms"], sorted(((round(v, 1), n[:60]) for n, v in (r.get("kernel_split") or {}).items()), reverse=True)[:8])
PY
tar -C /tmp/r -cf $OUT/r.tar . && echo "packed at $(el) s"
