#!/usr/bin/env bash
# Session 25 call 1: cp=auto's training table refit: h200-bwd (40 cases, bwd and fwdbwd), cp=off + bwd_cp=off
# against cp=on, on HEAD 09b0d35's kernels.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
timeout 520 python -m qlabench run --arch sm90 --sweep h200-bwd --phase bwd,fwdbwd \
  --backends "qla:cp=off+bwd_cp=off,qla:cp=on" --no-progress --out $OUT/cp-ab.json > $OUT/cp-ab.log 2>&1
echo "run rc $? at $(el) s"
grep -v -i "warn" $OUT/cp-ab.log | tail -5
