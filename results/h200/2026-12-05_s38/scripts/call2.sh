#!/usr/bin/env bash
# Session 38, call 2. Trees (.device/s38/trees.tar.xz): cur (main's kernels, 3db3889), gtail (wip/s38-gtail: bwd_chunk
# non-persistent, a GQA group's v-head tails deferred under the next v-head's loads), per2tail (wip/s38-per2tail:
# persistent with the original load order, every tail deferred).
#   C. h200-bwd phase bwd qla: cur, gtail, per2tail; compare; the pick: the lower geomean if under 1.
#   B. the whole GPU suite (.device/gpu-tests) in the pick's tree.
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s35",
# ".device/s38", ".device/gpu-tests"], command "bash .device/gpu-env.sh bash .device/s38/call2.sh", timeout_s 600
set -u
. .device/s35/common.sh
call_setup c2
[ -d .device/s38/trees/cur ] || tar -xJf .device/s38/trees.tar.xz -C .device/s38/
TR=$PWD/.device/s38/trees
cp $TR/COMMITS $d/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $d/gpu.txt 2>&1
R="--sweep h200-bwd --phase bwd --backends qla"
for t in cur gtail per2tail; do run b_$t 100 $t $R; done
for t in gtail per2tail; do
  python -m qlabench compare $d/b_cur.json $d/b_$t.json > $d/cmp_$t.txt 2>&1
  echo "== $t"; grep -E "FASTER|SLOWER|geomean|qla:" $d/cmp_$t.txt | head -30
done
pk
pick=$(python - "$d" <<'PY'
import re, sys
g = {}
for t in ("gtail", "per2tail"):
    m = re.search(r"qla: ([0-9.]+) over", open(f"{sys.argv[1]}/cmp_{t}.txt").read())
    if m:
        g[t] = float(m.group(1))
best = min(g, key=g.get) if g else None
print(best if best and g[best] < 1.0 else "none")
PY
)
echo "pick $pick (by the API geomean)" | tee $d/pick.txt; pk
# B. the whole GPU suite in the pick's tree (the commit to land carries its qlabench and tests unchanged):
# .device/gpu-tests without its cd to the git top level
if [ "$pick" != none ]; then
  sed '/^cd "\$(git rev-parse/d' .device/gpu-tests > /tmp/gpu-tests-tree
  mkdir -p $d/suite
  (cd $TR/$pick && OUT=$d/suite timeout -s KILL 420 bash /tmp/gpu-tests-tree > $d/suite/gpu-tests-summary.txt 2>&1
   echo "exit $?" >> $d/suite/gpu-tests-summary.txt)
  cat $d/suite/gpu-tests-summary.txt; pk
fi
echo "done at $(el) s"
