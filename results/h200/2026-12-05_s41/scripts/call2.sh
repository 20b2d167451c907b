#!/usr/bin/env bash
# Session 41, call 2: finish call 1's h200-bwd phase bwd (qla) at main 25b8923 on the H200 (--resume over its 24 rows).
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s41"],
# command "bash .device/s41/call2.sh", timeout_s 230
set -u
t0=$(date +%s)
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt 2>&1
grep -q H200 $OUT/gpu.txt || { echo "not an H200"; cat $OUT/gpu.txt; exit 3; }
cp .device/s41/h200_bwd_qla.json $OUT/
QLABENCH_GIT_COMMIT=25b8923 timeout -s KILL 215 bash .device/gpu-env.sh python -m qlabench run --arch sm90 \
  --no-progress --sweep h200-bwd --phase bwd --backends qla --resume --out $OUT/h200_bwd_qla.json \
  > $OUT/h200_bwd_qla.log 2>&1
echo "sweep rc $? at $(( $(date +%s) - t0 )) s"
