#!/usr/bin/env bash
# Session 32 call 2: bwd_h_ws with Y formed in registers and X = diag(beta) A^T K (no Ab pass), bwd_dh_ws's eDO and
# bwd_fused's eDO formed in registers: bwd_h alone, the 1x32768 split, h200-bwd phase bwd, then the backward GPU tests.
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
for c in "16 64 64" "16 64 32" "16 32 64" "16 16 32" "16 16 64"; do timeout 60 python .device/s32/h_alone.py $c >> $d/alone.txt 2>&1; done
echo "alone at $(el) s"; pk
run split 120 --cfg hk16_hv16 --cfg hk16_hv64 --seqlens 1x32768 --phase bwd --backends qla --kernel-split
run bwd 170 --sweep h200-bwd --phase bwd --backends qla
python -m qlabench compare .device/s32/s31_bwd.json $d/bwd.json > $d/cmp_bwd.txt 2>&1
pk
for f in tests/kernels/test_backward_gpu.py tests/kernels/test_bwd_fused_gpu.py tests/kernels/test_dg_stress_gpu.py tests/kernels/test_backward_cp_gpu.py; do
  (timeout 250 python -m pytest -q -m gpu -p no:cacheprovider $f > $d/$(basename $f .py).log 2>&1; echo "exit $?" >> $d/$(basename $f .py).log) &
done
wait; pk
grep -v INFO $d/alone.txt
grep -A16 "PER-KERNEL" $d/split.log | head -30
grep -v "^bwd" $d/cmp_bwd.txt | tail -6; grep "SLOWER\|FASTER" $d/cmp_bwd.txt | head -50
grep -A14 "vs peers" $d/bwd.log | head -16
grep -c "ok" $d/bwd.log; grep -i "fail\|error\|wrong" $d/bwd.log | head -5
for f in $d/test_*.log; do echo "$(basename $f): $(grep -E 'passed|failed' $f | tail -1) $(tail -1 $f)"; grep -E "^FAILED|^ERROR" $f | head; done
echo "done at $(el) s"
