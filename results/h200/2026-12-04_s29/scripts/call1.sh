#!/usr/bin/env bash
# Session 29 call 1: bwd_fused p0 (main's kernel) against p1 (S0 / A of the next chunk prefetched at the hand-off; V / dO
# waited for before BAR_AG), QLABENCH_FUSED_PREFETCH selects; h200-bwd hk16_hv16 phase bwd, default and
# cp=on+bwd_dh=fused; then the split at 1x32768 under p1, bwd_fused's GPU tests under p1, ncu of bwd_fused p1.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
head=$(cat .device/s29/HEAD)
d=/tmp/c1_$t0; mkdir -p $d
save() { tar -C $d -cf $OUT/c1.tar .; }
run() {  # name prefetch timeout args...
  local name=$1 pf=$2 lim=$3; shift 3
  QLABENCH_FUSED_PREFETCH=$pf QLABENCH_GIT_COMMIT=$head+p$pf timeout $lim python -m qlabench run --arch sm90 \
    --no-progress --out $d/$name.json "$@" > $d/$name.log 2>&1
  echo "$name rc $? at $(el) s"; save
}
run ab_p0 0 170 --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla,qla:cp=on+bwd_dh=fused
run ab_p1 1 170 --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla,qla:cp=on+bwd_dh=fused
python -m qlabench compare $d/ab_p0.json $d/ab_p1.json > $d/compare.txt 2>&1; save
run split_p1 1 100 --cfg hk16_hv16 --seqlens 1x32768 --phase bwd --backends qla --kernel-split
QLABENCH_FUSED_PREFETCH=1 timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_bwd_fused_gpu.py \
  > $d/test_fused_p1.log 2>&1; echo "tests rc $? at $(el) s"; save
QLABENCH_FUSED_PREFETCH=1 timeout 100 ncu --target-processes all --kernel-name regex:bwd_fused_kernel --launch-count 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  --section WarpStateStats --section SchedulerStats \
  python -m qlabench run --arch sm90 --cfg hk16_hv16 --seqlens 1x32768 --phase bwd --backends qla --warmup 0 \
    --repeats 1 --timer events --no-progress --out /tmp/ncu-$t0.json > $d/ncu-fused-p1.txt 2>&1
echo "ncu rc $? at $(el) s"; save
for f in ab_p0 ab_p1; do echo "== $f"; grep -A12 "BENCHMARKS" $d/$f.log | tail -10; grep -A16 "PEAK MEMORY" $d/$f.log | tail -11; done
tail -25 $d/compare.txt
grep -A22 "PER-KERNEL" $d/split_p1.log
tail -3 $d/test_fused_p1.log
grep -h "Duration\|DRAM Throughput\|Registers Per\|Eligible Warps\|No Eligible\|Stall" $d/ncu-fused-p1.txt | head -20
