#!/usr/bin/env bash
# Prepared in session 36 for the next GPU session's first call.
#   A. bwd_dh_ws alone: cur (the checkout, main) against edo (wip/s36-edo, .device/s36/trees: at BV 32 the state
#      warpgroup forms eDO) at BV 32, and edo forced on at BV 64 (QLABENCH_DH_EDO=state) against cur.
#   B. if edo is faster at (16, 16, 32): its dh_ws GPU test, the backward and CP-backward GPU tests (in parallel).
#   C. if they pass: h200-bwd phase bwd (qla), cur and edo, one call; compare. Landing edo then needs the whole
#      GPU suite at the landed commit (the next call).
#   D. bwd_chunk alone: cur against cprobe (wip/s35-chunk-probe, .device/s35/trees): the probe table.
#   E. the per-kernel split of every hk16_hv16 pattern (the worst FLA rows), if time is left.
#   args: the checkout's commit. Output $OUT/n1.tar (packed after every step); the verdict in edo.txt.
#   device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz",
#   ".device/s35", ".device/s36"] (results/ moved out of the tree first),
#   command "bash .device/gpu-env.sh bash .device/s36/next1.sh <commit>", timeout_s 600
set -u
. .device/s35/common.sh
call_setup n1
tar -xJf .device/s36/trees.tar.xz -C .device/s35/   # adds trees/edo; its COMMITS line below
cat .device/s35/trees/COMMITS > /dev/null
grep -q "^edo " $TR/COMMITS || tar -xJOf .device/s36/trees.tar.xz trees/COMMITS >> $TR/COMMITS 2>/dev/null
mkdir -p $TR/cur && cp -r qlabench tests configs pyproject.toml $TR/cur/ && echo "cur $1" >> $TR/COMMITS
cp $TR/COMMITS $d/
# A
alone() {  # tree cfg [env]
  local t=$1 c=$2; shift 2
  echo "== $t $c $*" >> $d/alone.txt
  env "$@" PYTHONPATH=$TR/$t:$PYTHONPATH timeout -s KILL 60 python $S/dh_alone.py $c >> $d/alone.txt 2>&1
  echo "rc $?" >> $d/alone.txt; pk
}
for c in "16 16 32" "16 64 32" "2 4 32"; do alone cur "$c" X=0; alone edo "$c" X=0; done
for c in "16 64 64" "16 32 64"; do alone cur "$c" X=0; alone edo "$c" QLABENCH_DH_EDO=state; done
grep -E "^==|has_skip" $d/alone.txt
win=$(python - "$d" <<'PY'
import re, sys
t = {}
for block in open(f"{sys.argv[1]}/alone.txt").read().split("== ")[1:]:
    name = block.split("\n")[0].split()
    m = re.search(r"has_skip 0: [0-9.]+ us, ([0-9.]+) us per", block)
    if m:
        t[(name[0], *name[1:4])] = float(m.group(1))
a, b = t.get(("cur", "16", "16", "32")), t.get(("edo", "16", "16", "32"))
print("yes" if a and b and b < 0.98 * a else "no")
PY
)
echo "edo faster alone at (16, 16, 32): $win" | tee $d/edo.txt; pk
# B, C
if [ "$win" = yes ]; then
  for f in tests/kernels/test_bwd_dh_ws_compile.py tests/kernels/test_backward_gpu.py tests/kernels/test_backward_cp_gpu.py; do
    (cd $TR/edo && timeout -s KILL 200 python -m pytest -q -m gpu -p no:cacheprovider $f > $d/t_edo_$(basename $f .py).log 2>&1
     echo "exit $?" >> $d/t_edo_$(basename $f .py).log) &
  done
  wait; pk
  ok=yes
  for f in $d/t_edo_*.log; do
    echo "$(basename $f): $(grep -E "passed|failed" $f | tail -1) $(tail -1 $f)"; grep -E "^FAILED" $f | head -4
    tail -1 $f | grep -q "exit 0" || ok=no
  done
  echo "edo tests pass: $ok" | tee -a $d/edo.txt; pk
  if [ $ok = yes ]; then
    R="--sweep h200-bwd --phase bwd --backends qla"
    run b_cur 100 cur $R
    run b_edo 100 edo $R
    python -m qlabench compare $d/b_cur.json $d/b_edo.json > $d/cmp_edo.txt 2>&1; pk
    grep -E "FASTER|SLOWER|geomean|qla:" $d/cmp_edo.txt | head -30
    grep -E "Over tolerance" $d/b_edo.log
  fi
fi
echo "edo done at $(el) s"
# D
for c in "16 32" "16 16"; do
  [ $(el) -lt 470 ] || break
  for t in cur cprobe; do
    echo "== $t $c" >> $d/chunk_alone.txt
    PYTHONPATH=$TR/$t:$PYTHONPATH timeout -s KILL 40 python $S/chunk_alone.py $c >> $d/chunk_alone.txt 2>&1
    echo "rc $?" >> $d/chunk_alone.txt; pk
  done
done
grep -v INFO $d/chunk_alone.txt 2>/dev/null
# E
[ $(el) -lt 420 ] && run sp16 130 cur --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla --kernel-split
grep -E "^bwd|_kernel|^sum|^median" $d/sp16.log 2>/dev/null | head -60
echo "done at $(el) s"
