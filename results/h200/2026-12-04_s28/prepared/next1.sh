#!/usr/bin/env bash
# Prepared in session 28 for a checkout of branch wip/s28-fused-prefetch (results/h200/NOTES.md, "session 28's view"):
# bwd_fused variants (env switches read by backward._kernels on that branch): p1 = the next chunk's S0 / A prefetched
# at the hand-off (QLABENCH_FUSED_PREFETCH), l1 = V / dO waited for after the first products (QLABENCH_FUSED_LATE_V);
# p0l0 is main's kernel (the same IR). 1) test_bwd_fused_gpu.py under p1l0 and p1l1, test_backward_cp_gpu.py under
# p1l1, in parallel; 2) h200-bwd hk16_hv16 phase bwd for p0l0 and each variant whose tests passed, one process each,
# `qlabench compare` against p0l0; 3) the split at 1x32768 of the last variant run. Kernels for hk1, hk2, hk4, hk16
# (all three) are in .device/tlcache. Write the commit first: git rev-parse --short HEAD > .device/s28/HEAD. ~5 min.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
head=$(cat .device/s28/HEAD)
d=/tmp/n1_$t0; mkdir -p $d
t() {  # name prefetch late file
  (QLABENCH_FUSED_PREFETCH=$2 QLABENCH_FUSED_LATE_V=$3 timeout 400 python -m pytest -q -m gpu -p no:cacheprovider $4 \
     > $d/test_$1.log 2>&1; echo "exit $?" >> $d/test_$1.log) &
}
t fused_p1l0 1 0 tests/kernels/test_bwd_fused_gpu.py
t fused_p1l1 1 1 tests/kernels/test_bwd_fused_gpu.py
t cp_p1l1 1 1 tests/kernels/test_backward_cp_gpu.py
wait
for l in $d/test_*.log; do echo "$(basename $l): $(tail -2 $l | tr '\n' ' ')"; done
echo "tests at $(el) s"; tar -C $d -cf $OUT/n1.tar .
ok() { tail -1 $d/test_$1.log | grep -q "exit 0"; }
run() {  # variant prefetch late
  QLABENCH_FUSED_PREFETCH=$2 QLABENCH_FUSED_LATE_V=$3 QLABENCH_GIT_COMMIT=$head+$1 timeout 120 python -m qlabench run \
    --arch sm90 --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla --no-progress --out $d/ab_$1.json \
    > $d/ab_$1.log 2>&1
  echo "ab $1 rc $? at $(el) s"; tar -C $d -cf $OUT/n1.tar .
}
run p0l0 0 0
last=""
if ok fused_p1l0; then run p1l0 1 0; last="1 0"; fi
if ok fused_p1l1 && ok cp_p1l1; then run p1l1 1 1; last="1 1"; fi
for v in p1l0 p1l1; do [ -f $d/ab_$v.json ] && { echo "== $v / p0l0"; python -m qlabench compare $d/ab_p0l0.json \
  $d/ab_$v.json 2>&1 | tail -12; } | tee -a $d/compare.txt; done
if [ -n "$last" ]; then set -- $last
  QLABENCH_FUSED_PREFETCH=$1 QLABENCH_FUSED_LATE_V=$2 QLABENCH_GIT_COMMIT=$head+p$1l$2 timeout 100 python -m qlabench run \
    --arch sm90 --cfg hk16_hv16 --seqlens 1x32768 --phase bwd --backends qla --kernel-split --no-progress \
    --out $d/split.json > $d/split.log 2>&1
  echo "split rc $? at $(el) s"; tar -C $d -cf $OUT/n1.tar .
  grep -A8 "PER-KERNEL" $d/split.log | tail -5
fi
