#!/usr/bin/env bash
# Prepared in session 27 for a checkout of branch wip/s27-fused (results/h200/NOTES.md, "session 27's view", item 4):
# the prototype bwd_fused (kernel option bwd_dh=fused) on the H200. 1) its GPU test (correctness against float64 and
# against the default kernels, plain and CP); 2) only if that passes: h200-bwd's hk16_hv16 cases, phase bwd, the
# default against bwd_dh=fused side by side (time, peak memory), and the per-kernel split at 1x32768. Its kernels for
# hk2_hv2, hk4_hv4, hk16_hv16 are compiled into .device/tlcache. Write the commit first:
# git rev-parse --short HEAD > .device/s27/HEAD. One tar back, appended after each step. ~4 min.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
export QLABENCH_GIT_COMMIT=$(cat .device/s27/HEAD)
mkdir -p /tmp/f1
timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_bwd_fused_gpu.py > /tmp/f1/test.log 2>&1
rc=$?; echo "test rc $rc at $(el) s"; tail -15 /tmp/f1/test.log; tar -C /tmp/f1 -cf $OUT/f1.tar .
[ $rc = 0 ] || exit 1
timeout 150 python -m qlabench run --arch sm90 --sweep h200-bwd --cfg hk16_hv16 --phase bwd \
  --backends qla,qla:bwd_dh=fused --no-progress --out /tmp/f1/ab.json > /tmp/f1/ab.log 2>&1
echo "ab rc $? at $(el) s"; tar -C /tmp/f1 -cf $OUT/f1.tar .
timeout 100 python -m qlabench run --arch sm90 --cfg hk16_hv16 --seqlens 1x32768 --phase bwd \
  --backends qla,qla:bwd_dh=fused --kernel-split --no-progress --out /tmp/f1/split.json > /tmp/f1/split.log 2>&1
echo "split rc $? at $(el) s"; tar -C /tmp/f1 -cf $OUT/f1.tar .
grep -v "^\s*$" /tmp/f1/ab.log | tail -40
