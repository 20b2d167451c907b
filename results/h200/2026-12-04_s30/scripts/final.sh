#!/usr/bin/env bash
# Session 30 final: h200-bwd phases bwd and fwdbwd (qla; the report takes the peers from results/h200/2026-11-29_f7c378e/),
# hk16_hv16 bwd with the non-fused CP backward forced (qla:bwd_dh=ws: the FUSED_MAX_CHAINS A/B at the final commit),
# then the per-kernel split at 1x32768 hk16_hv16 / hk16_hv64 and hk16_hv16 32k_2seq. One tar back, after each step.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
export QLABENCH_GIT_COMMIT=$(cat .device/s30/HEAD)
d=/tmp/final_$t0; mkdir -p $d
run() {  # name timeout args...
  local name=$1 lim=$2; shift 2
  timeout $lim python -m qlabench run --arch sm90 --no-progress --out $d/$name.json "$@" > $d/$name.log 2>&1
  echo "$name rc $? at $(el) s"; tar -C $d -cf $OUT/final.tar .
}
run bwd 150 --sweep h200-bwd --phase bwd --backends qla
run fwdbwd 180 --sweep h200-bwd --phase fwdbwd --backends qla
run ws 90 --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla:bwd_dh=ws
run split 120 --cfg hk16_hv16 --cfg hk16_hv64 --seqlens 1x32768 --phase bwd --backends qla --kernel-split
grep -A14 "BENCHMARKS" $d/bwd.log | tail -12
grep -B3 -A24 "PER-KERNEL" $d/split.log | head -45
grep "hk16_hv16" $d/ws.log | head -10
