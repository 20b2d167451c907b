#!/usr/bin/env bash
# Session 31 call 2 at HEAD: h200-bwd phase bwd (qla default) against session 30's final, hk16_hv16 with bwd_fused forced
# and with bwd_dh=ws, then the bwd_fused / backward CP / dg GPU tests. One tar back after each step.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
export QLABENCH_GIT_COMMIT=$(cat .device/s32/HEAD)
d=/tmp/c2_$t0; mkdir -p $d
pk() { tar -C $d -cf $OUT/c2.tar .; }
run() {  # name timeout args...
  local name=$1 lim=$2; shift 2
  timeout $lim python -m qlabench run --arch sm90 --no-progress --out $d/$name.json "$@" > $d/$name.log 2>&1
  echo "$name rc $? at $(el) s"; pk
}
run bwd 150 --sweep h200-bwd --phase bwd --backends qla
run fused 90 --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla:cp=on+bwd_dh=fused
run ws 90 --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla:bwd_dh=ws
python -m qlabench compare .device/s32/s30_bwd.json $d/bwd.json > $d/cmp_bwd.txt 2>&1
grep -v "^bwd" $d/cmp_bwd.txt | tail -6; grep "SLOWER\|FASTER" $d/cmp_bwd.txt | head -40
grep "hk16_hv16" $d/fused.log | grep -i "ms" | head -10; grep "hk16_hv16" $d/ws.log | grep -i "ms" | head -10
grep -A14 "Backward (bwd)" $d/bwd.log | head -16
for f in tests/kernels/test_bwd_fused_gpu.py tests/kernels/test_backward_cp_gpu.py tests/kernels/test_dg_stress_gpu.py; do
  [ -f $f ] || { echo "no $f"; continue; }
  (timeout 300 python -m pytest -q -m gpu -p no:cacheprovider $f > $d/$(basename $f .py).log 2>&1; echo "exit $?" >> $d/$(basename $f .py).log) &
done
wait; pk
for f in $d/test_*.log; do echo "$(basename $f): $(grep -E 'passed|failed' $f | tail -1) $(tail -1 $f)"; grep -E "^FAILED|^ERROR" $f | head; done
echo "done at $(el) s"
