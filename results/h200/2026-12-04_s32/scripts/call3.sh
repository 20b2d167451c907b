#!/usr/bin/env bash
# Session 32 final measurements at f257d4d (the final kernels): h200-bwd phase fwdbwd (qla), the per-kernel split at
# hk16_hv16 32k_8seq and hk16_hv32 / hk8_hv16 1x32768 (the GQA presets' FLA gap).
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
export QLABENCH_GIT_COMMIT=$(cat .device/s32/HEAD)
d=/tmp/c3_$t0; mkdir -p $d
pk() { tar -C $d -cf $OUT/c3.tar .; }
run() {  # name timeout args...
  local name=$1 lim=$2; shift 2
  timeout $lim python -m qlabench run --arch sm90 --no-progress --out $d/$name.json "$@" > $d/$name.log 2>&1
  echo "$name rc $? at $(el) s"; pk
}
run fwdbwd 200 --sweep h200-bwd --phase fwdbwd --backends qla
run split8 60 --cfg hk16_hv16 --seqlens 32k_8seq --phase bwd --backends qla --kernel-split
run splitgqa 90 --cfg hk16_hv32 --cfg hk8_hv16 --seqlens 1x32768 --phase bwd --backends qla --kernel-split
python -m qlabench compare .device/s32/s31_fwdbwd.json $d/fwdbwd.json > $d/cmp_fwdbwd.txt 2>&1; pk
grep -v "^fwdbwd" $d/cmp_fwdbwd.txt | tail -5
grep -A12 "PEAK MEMORY" $d/fwdbwd.log | tail -4; grep -i "over 1.25" $d/fwdbwd.log | head
grep -A20 "PER-KERNEL" $d/split8.log | sed -n 4,16p
grep -A40 "PER-KERNEL" $d/splitgqa.log | sed -n 4,40p
echo "done at $(el) s"
