#!/usr/bin/env bash
# Session 41, call 3 (warm H200): h200-bwd phase fwdbwd (qla) at main 25b8923 (120 s cap, rows written as they
# finish), then the per-kernel split at the small GQA presets' CP rows (phase bwd).
set -u
t0=$(date +%s)
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export QLABENCH_GIT_COMMIT=25b8923
timeout -s KILL 120 bash .device/gpu-env.sh python -m qlabench run --arch sm90 --no-progress --sweep h200-bwd \
  --phase fwdbwd --backends qla --out $OUT/h200_fwdbwd_qla.json > $OUT/h200_fwdbwd_qla.log 2>&1
echo "fwdbwd rc $? at $(( $(date +%s) - t0 )) s"
timeout -s KILL 60 bash .device/gpu-env.sh python -m qlabench run --arch sm90 --no-progress \
  --cfg hk4_hv8,hk2_hv4 --seqlens 8k_1seq,32k_1seq --phase bwd --backends qla --kernel-split \
  --out $OUT/split_small.json > $OUT/split_small.log 2>&1
echo "split rc $? at $(( $(date +%s) - t0 )) s"
