#!/usr/bin/env bash
# Session 25 call 2: bwd_h beside the dh pass on two streams. h200-bwd's 40 cases, phase bwd, three trees:
# old = bf924db (one stream), conc = two streams with the old V-tile model, new = two streams + the V-tile model
# of the two grids side by side.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
run() {  # tree name
  timeout 170 python -m qlabench run --arch sm90 --sweep h200-bwd --phase bwd --backends qla --no-progress \
    --out $OUT/bwd-$1.json > $OUT/bwd-$1.log 2>&1
  echo "$1 rc $? at $(el) s"
}
(cd .device/old && PYTHONPATH=$PWD:$PYTHONPATH run old)
(cd .device/conc && PYTHONPATH=$PWD:$PYTHONPATH run conc)
run new
(cd .device/old && PYTHONPATH=$PWD:$PYTHONPATH run old2)
python - <<'PY'
import json, os, math
out = os.environ["OUT"]
def load(n):
    try:
        return {(r["preset"], r["pattern"]): r for r in json.load(open(f"{out}/bwd-{n}.json"))["rows"]}
    except Exception as e:
        print(n, "unreadable", e); return {}
o, c, n, o2 = load("old"), load("conc"), load("new"), load("old2")
lc, ln = [], []
for k in o:
    if k in c and k in n and all(x[k]["status"] == "ok" for x in (o, c, n)):
        a, b, d = o[k]["median_ms"], c[k]["median_ms"], n[k]["median_ms"]
        lc.append(math.log(b / a)); ln.append(math.log(d / a))
        print(f"{k[0]:10s} {k[1]:9s} old {a:.3f} old2 {o2.get(k, {}).get('median_ms', float('nan')):.3f} conc {b:.3f} ({b/a:.2f}) new {d:.3f} ({d/a:.2f})")
    else:
        print(k, "status", [x.get(k, {}).get("status") for x in (o, c, n)])
if lc:
    print(f"geomean conc/old {math.exp(sum(lc)/len(lc)):.3f}  new/old {math.exp(sum(ln)/len(ln)):.3f}  ({len(lc)} cases)")
PY
