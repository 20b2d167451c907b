#!/usr/bin/env bash
# Session 42: h200-bwd phase bwd for the peers (FLA Triton, flash-qla) on this machine, resumable.
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/s42"], command "bash .device/s42/peers.sh", timeout_s 600
set -u
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt 2>&1
export QLABENCH_GIT_COMMIT=7641d9d
res=""
if [ -f .device/s42/peers.json ]; then cp .device/s42/peers.json $OUT/; res="--resume"; fi
timeout -s KILL 570 bash .device/gpu-env.sh python -m qlabench run --arch sm90 --no-progress --sweep h200-bwd \
  --phase bwd --backends fla,flash_qla --out $OUT/peers.json $res > $OUT/peers.log 2>&1
echo "sweep rc $? at $(( $(date +%s) - t0 )) s"; tail -n 5 $OUT/peers.log
