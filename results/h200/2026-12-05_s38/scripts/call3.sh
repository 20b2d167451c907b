#!/usr/bin/env bash
# Session 38, call 3 (the budget left after four refused starts fits one short call). Trees as call2.sh.
#   C. h200-bwd phase bwd qla: cur and gtail; compare.
#   B. if gtail's geomean is under 1: the whole GPU suite (.device/gpu-tests) in gtail's tree (the commit to land
#      carries its qlabench and tests unchanged); else per2tail's sweep and compare.
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s35",
# ".device/s38", ".device/gpu-tests"], command "bash .device/gpu-env.sh bash .device/s38/call3.sh", timeout_s 600
set -u
. .device/s35/common.sh
call_setup c3
[ -d .device/s38/trees/cur ] || tar -xJf .device/s38/trees.tar.xz -C .device/s38/
TR=$PWD/.device/s38/trees
cp $TR/COMMITS $d/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $d/gpu.txt 2>&1
R="--sweep h200-bwd --phase bwd --backends qla"
run b_cur 100 cur $R
run b_gtail 100 gtail $R
python -m qlabench compare $d/b_cur.json $d/b_gtail.json > $d/cmp_gtail.txt 2>&1; pk
grep -E "FASTER|SLOWER|geomean|qla:" $d/cmp_gtail.txt | head -30
win=$(python - "$d" <<'PY'
import re, sys
m = re.search(r"qla: ([0-9.]+) over", open(f"{sys.argv[1]}/cmp_gtail.txt").read())
print("yes" if m and float(m.group(1)) < 1.0 else "no")
PY
)
echo "gtail faster: $win" | tee $d/pick.txt; pk
if [ "$win" = yes ]; then
  sed -e '/^cd "\$(git rev-parse/d' -e 's|^tmp=$(mktemp -d)|tmp=$SUITE_LOGS|' .device/gpu-tests > /tmp/gpu-tests-tree
  mkdir -p $d/suite/logs
  export SUITE_LOGS=$d/suite/logs
  (while sleep 30; do pk; done) & packer=$!
  (cd $TR/gtail && OUT=$d/suite timeout -s KILL 440 bash /tmp/gpu-tests-tree > $d/suite/gpu-tests-summary.txt 2>&1
   echo "exit $?" >> $d/suite/gpu-tests-summary.txt)
  kill $packer; cat $d/suite/gpu-tests-summary.txt; pk
else
  run b_per2tail 100 per2tail $R
  python -m qlabench compare $d/b_cur.json $d/b_per2tail.json > $d/cmp_per2tail.txt 2>&1; pk
  grep -E "FASTER|SLOWER|geomean|qla:" $d/cmp_per2tail.txt | head -30
fi
echo "done at $(el) s"
