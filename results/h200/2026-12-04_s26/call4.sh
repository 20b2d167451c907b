#!/usr/bin/env bash
# Session 26 call 4: Nsight Compute on bwd_chunk and bwd_dh_ws (first launch of each) at hk16_hv16 1x8192 and
# hk16_hv64 1x8192, the checkout's code: stall reasons, pipe and memory throughput for the next session's redesign.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
which ncu; ncu --version | tail -1
for cfg in hk16_hv16 hk16_hv64; do
  timeout 200 ncu --target-processes all --kernel-name regex:"bwd_chunk_kernel|bwd_dh_ws_kernel" --launch-count 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats --section SourceCounters \
    python -m qlabench run --arch sm90 --cfg $cfg --seqlens 1x8192 --phase bwd --backends qla --warmup 0 --repeats 1 \
      --timer events --no-progress --out /tmp/ncu-$cfg.json > $OUT/ncu-$cfg.txt 2>&1
  echo "$cfg rc $? at $(el) s"
done
