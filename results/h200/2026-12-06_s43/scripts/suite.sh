#!/usr/bin/env bash
# Session 43: the whole GPU suite at the working tree's commit, then (time left) the per-kernel split at 1x32768
# hk16_hv16 / hk16_hv64, phase bwd, ours and flash-qla (the table).
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz",
# ".device/gpu-tests", ".device/s43"], command "bash .device/s43/suite.sh COMMIT", timeout_s 600
set -u
t0=$(date +%s)
c=$1
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt 2>&1
bash .device/gpu-env.sh bash .device/gpu-tests > $OUT/gpu-tests-summary.txt 2>&1
echo "exit status $? (wall $(( $(date +%s) - t0 )) s)" >> $OUT/gpu-tests-summary.txt
cat $OUT/gpu-tests-summary.txt
export QLABENCH_GIT_COMMIT=$c
left=$(( 590 - ($(date +%s) - t0) ))
timeout -s KILL $left bash .device/gpu-env.sh python -m qlabench run --arch sm90 --no-progress \
  --cfg hk16_hv16,hk16_hv64 --seqlens 1x32768 --phase bwd --backends qla,flash_qla --kernel-split \
  --out $OUT/split32k.json > $OUT/split32k.log 2>&1
echo "split rc $? at $(( $(date +%s) - t0 )) s"; tail -n 4 $OUT/split32k.log
