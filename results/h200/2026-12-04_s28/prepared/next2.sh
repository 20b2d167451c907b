#!/usr/bin/env bash
# Prepared in session 28 (results/h200/NOTES.md, "session 28's view"), on main or the prefetch branch: 1) the memory
# rows' option: h200-bwd hk16_hv16 phases bwd and fwdbwd, the default against qla:cp=on+bwd_dh=fused (bwd_fused over
# cp.py's regular pieces on every row); 2) ncu on bwd_fused at hk16_hv16 1x32768 (full sections) and, for comparison,
# bwd_chunk there (qla:bwd_dh=ws). Write the commit first: git rev-parse --short HEAD > .device/s28/HEAD. ~4 min.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
export QLABENCH_GIT_COMMIT=$(cat .device/s28/HEAD)
d=/tmp/n2_$t0; mkdir -p $d
for ph in bwd fwdbwd; do
  timeout 150 python -m qlabench run --arch sm90 --sweep h200-bwd --cfg hk16_hv16 --phase $ph \
    --backends qla,qla:cp=on+bwd_dh=fused --no-progress --out $d/mem_$ph.json > $d/mem_$ph.log 2>&1
  echo "mem $ph rc $? at $(el) s"; tar -C $d -cf $OUT/n2.tar .
done
q() {  # backend kernel-regex out
  timeout 150 ncu --target-processes all --kernel-name regex:"$2" --launch-count 1 --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section SourceCounters \
    python -m qlabench run --arch sm90 --cfg hk16_hv16 --seqlens 1x32768 --phase bwd --backends $1 --warmup 0 \
      --repeats 1 --timer events --no-progress --out /tmp/ncu-$3-$t0.json > $d/ncu-$3.txt 2>&1
  echo "ncu $3 rc $? at $(el) s"; tar -C $d -cf $OUT/n2.tar .
}
q qla bwd_fused_kernel fused
q qla:bwd_dh=ws bwd_chunk_kernel chunk
for ph in bwd fwdbwd; do grep -A12 "BENCHMARKS" $d/mem_$ph.log; grep -A12 "PEAK MEMORY" $d/mem_$ph.log | tail -9; done
grep -h "Duration\|DRAM Throughput\|Registers Per\|Eligible Warps\|No Eligible" $d/ncu-*.txt
