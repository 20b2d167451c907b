#!/usr/bin/env bash
# Session 25 call 3: A/B of two changes over h200-bwd's 40 cases (phase bwd), four trees:
#   old = 580fed9 (bwd_h beside the dh pass), e1 = + bwd_chunk's first v-head loads issued with Q, K,
#   lpt = + the chunk recurrences' blocks longest chain first (seq_order), new = e1 + lpt (working tree);
# then the tree the rule picks runs the final h200-bwd sweep (bwd with --kernel-split, fwdbwd).
# Rule: a change is kept if its tree's time is <= 0.99x the tree without it, geomean over its rows
# (e1: all 40 rows; lpt: the multi-sequence rows, where the order can differ).
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
root=$PWD
ab() {  # tree
  local dir=$root; [ "$1" = new ] || dir=$root/.device/$1
  (cd $dir && PYTHONPATH=$dir:$PYTHONPATH timeout 95 python -m qlabench run --arch sm90 --sweep h200-bwd --phase bwd \
     --backends qla --no-progress --out $OUT/ab-$1.json > $OUT/ab-$1.log 2>&1)
  echo "$1 rc $? at $(el) s"
}
ab old; ab e1; ab lpt; ab new
pick=$(python - <<'PY'
import json, os, math
out = os.environ["OUT"]
def load(n):
    try:
        return {(r["preset"], r["pattern"]): r for r in json.load(open(f"{out}/ab-{n}.json"))["rows"]}
    except Exception:
        return {}
t = {n: load(n) for n in ("old", "e1", "lpt", "new")}
def gm(a, b, multi=False):
    ks = [k for k in t[a] if k in t[b] and t[a][k]["status"] == t[b][k]["status"] == "ok"
          and (not multi or t[a][k]["n_seqs"] > 1)]
    if len(ks) < (24 if multi else 40):
        return 9.0
    return math.exp(sum(math.log(t[a][k]["median_ms"] / t[b][k]["median_ms"]) for k in ks) / len(ks))
import sys
r = {"e1/old": gm("e1", "old"), "new/lpt": gm("new", "lpt"), "lpt/old": gm("lpt", "old", True),
     "new/e1": gm("new", "e1", True)}
print(r, file=sys.stderr)
e1 = r["e1/old"] <= 0.99 and r["new/lpt"] <= 0.99
lpt = r["lpt/old"] <= 0.99 and r["new/e1"] <= 0.99
print({(True, True): "new", (True, False): "e1", (False, True): "lpt", (False, False): "old"}[(e1, lpt)])
PY
)
echo "pick: $pick at $(el) s"; echo "$pick" > $OUT/pick.txt
dir=$root; [ "$pick" = new ] || dir=$root/.device/$pick
cd $dir
PYTHONPATH=$dir:$PYTHONPATH timeout 130 python -m qlabench run --arch sm90 --sweep h200-bwd --phase bwd --backends qla \
  --kernel-split --no-progress --out $OUT/h200-bwd-qla.json > $OUT/h200-bwd.log 2>&1
echo "bwd sweep rc $? at $(el) s"
PYTHONPATH=$dir:$PYTHONPATH timeout 110 python -m qlabench run --arch sm90 --sweep h200-bwd --phase fwdbwd --backends qla \
  --no-progress --out $OUT/h200-fwdbwd-qla.json > $OUT/h200-fwdbwd.log 2>&1
echo "fwdbwd sweep rc $? at $(el) s"
