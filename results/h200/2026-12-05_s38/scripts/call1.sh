#!/usr/bin/env bash
# Session 38, call 1. Trees (.device/s38/trees.tar.xz): cur (main's kernels, 3db3889), per (wip/s38-persist: bwd_chunk
# persistent, the first v-head's loads with Q, K at the item's top), tail (wip/s38-tail: per + each v-head's dg / dbeta
# tail deferred under the next v-head's load wait), tailf (wip/s38-tailf: tail + bwd_fused's chunk tail deferred too).
#   A. bwd_chunk alone at (16,32) (16,16) (8,16) (2,4) (16,64), T 32768: cur, per, tail.
#   B. the backward GPU test files of tailf, in parallel.
#   C. if time is left: h200-bwd phase bwd qla, cur and the faster variant (tailf if tail and its tests pass); compare.
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s35",
# ".device/s38"], command "bash .device/gpu-env.sh bash .device/s38/call1.sh", timeout_s 600
set -u
. .device/s35/common.sh
call_setup c1
[ -d .device/s38/trees/cur ] || tar -xJf .device/s38/trees.tar.xz -C .device/s38/
TR=$PWD/.device/s38/trees
cp $TR/COMMITS $d/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $d/gpu.txt 2>&1
for c in "16 32" "16 16" "8 16" "2 4" "16 64"; do
  for t in cur per tail; do
    echo "== $t $c" >> $d/alone.txt
    PYTHONPATH=$TR/$t:$PYTHONPATH timeout -s KILL 60 python .device/s38/chunk_alone.py $c >> $d/alone.txt 2>&1
    echo "rc $?" >> $d/alone.txt
  done
  pk
done
grep -E "^==|alone H_qk|rc [^0]|Error" $d/alone.txt
echo "A done at $(el) s"
for t in tailf; do
  for f in tests/kernels/test_backward_gpu.py tests/kernels/test_backward_cp_gpu.py tests/kernels/test_dg_stress_gpu.py \
           tests/kernels/test_bwd_fused_gpu.py; do
    (cd $TR/$t && timeout -s KILL 250 python -m pytest -q -m gpu -p no:cacheprovider $f > $d/t_${t}_$(basename $f .py).log 2>&1
     echo "exit $?" >> $d/t_${t}_$(basename $f .py).log) &
  done
done
wait; pk
for f in $d/t_*.log; do
  echo "$(basename $f): $(grep -E "passed|failed" $f | tail -1) $(tail -1 $f)"; grep -E "^FAILED" $f | head -4
done
echo "B done at $(el) s"
pick=$(python - "$d" <<'PY'
import re, sys
t = {}
for block in open(f"{sys.argv[1]}/alone.txt").read().split("== ")[1:]:
    name = block.split("\n")[0].split()
    m = re.search(r": ([0-9.]+) us,", block)
    if m:
        t.setdefault(name[0], []).append(float(m.group(1)))
import math
g = {k: math.exp(sum(map(math.log, v)) / len(v)) for k, v in t.items() if len(v) == len(t.get("cur", []))}
print(min((v, k) for k, v in g.items() if k != "cur")[1] if len(g) > 1 else "none")
PY
)
ok=yes
for f in $d/t_tailf_*.log; do tail -1 $f | grep -q "exit 0" || ok=no; done
[ "$pick" = tail ] && [ $ok = yes ] && pick=tailf
echo "pick $pick (tailf tests pass: $ok)" | tee $d/pick.txt; pk
if [ "$pick" != none ] && [ $(el) -lt 380 ]; then
  R="--sweep h200-bwd --phase bwd --backends qla"
  run b_cur 100 cur $R
  run b_$pick 100 $pick $R
  python -m qlabench compare $d/b_cur.json $d/b_$pick.json > $d/cmp.txt 2>&1; pk
  grep -E "FASTER|SLOWER|geomean|qla:" $d/cmp.txt | head -30
fi
echo "done at $(el) s"
