#!/usr/bin/env bash
# Session 42: the whole GPU suite at the working tree's commit, then h200-bwd phase bwd (qla) with the time left
# (resumed from a carried partial file when one is given).
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz",
# ".device/gpu-tests", ".device/s42"], command "bash .device/s42/suite.sh COMMIT [skip-tests]", timeout_s 600
set -u
t0=$(date +%s)
c=$1; skip=${2:-}
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt 2>&1
if [ -z "$skip" ]; then
  bash .device/gpu-env.sh bash .device/gpu-tests > $OUT/gpu-tests-summary.txt 2>&1
  echo "exit status $? (wall $(( $(date +%s) - t0 )) s)" >> $OUT/gpu-tests-summary.txt
  cat $OUT/gpu-tests-summary.txt
  cp -r /tmp/gpu-tests-logs $OUT/ 2>/dev/null
fi
export QLABENCH_GIT_COMMIT=$c
left=$(( 585 - ($(date +%s) - t0) ))
res=""
if [ -f .device/s42/h200_bwd_qla.json ]; then cp .device/s42/h200_bwd_qla.json $OUT/; res="--resume"; fi
timeout -s KILL $left bash .device/gpu-env.sh python -m qlabench run --arch sm90 --no-progress --sweep h200-bwd \
  --phase bwd --backends qla --out $OUT/h200_bwd_qla.json $res > $OUT/h200_bwd_qla.log 2>&1
echo "sweep rc $? at $(( $(date +%s) - t0 )) s"; tail -n 5 $OUT/h200_bwd_qla.log
echo "done at $(( $(date +%s) - t0 )) s"
