#!/usr/bin/env bash
# Prepared in session 27 (results/h200/NOTES.md, "session 27's view", items 3 and 5): Nsight Compute at 1x32768 on the
# checkout's kernels. bwd_h_ws and bwd_dh_ws at hk16_hv64 (SpeedOfLight, MemoryWorkloadAnalysis: is the h / dh phase
# DRAM-bound? ncu runs one kernel at a time, so this is each alone), bwd_chunk at hk16_hv16 (full sections, after the
# staged stores and F_PAD). Write the commit first: git rev-parse --short HEAD > .device/s27/HEAD. ~3-4 min.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
export QLABENCH_GIT_COMMIT=$(cat .device/s27/HEAD)
q() {  # cfg kernel-regex launch-count out sections...
  local cfg=$1 re=$2 n=$3 out=$4; shift 4
  timeout 150 ncu --target-processes all --kernel-name regex:"$re" --launch-count $n "$@" \
    python -m qlabench run --arch sm90 --cfg $cfg --seqlens 1x32768 --phase bwd --backends qla --warmup 0 --repeats 1 \
      --timer events --no-progress --out /tmp/ncu-$out.json > $OUT/ncu-$out.txt 2>&1
  echo "$out rc $? at $(el) s"
}
q hk16_hv64 "bwd_h_ws_kernel|bwd_dh_ws_kernel" 2 hv64-h-dh --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section Occupancy --section LaunchStats
q hk16_hv16 "bwd_chunk_kernel" 1 hv16-chunk --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section SourceCounters
grep -h "DRAM Throughput\|Duration\|Memory Throughput\|Eligible Warps\|Issued Warp" $OUT/ncu-*.txt
