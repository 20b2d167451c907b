#!/usr/bin/env bash
# Session 31 final (at the final kernel commit): h200-bwd phases bwd and fwdbwd (qla; the report takes the peers from
# results/h200/2026-11-29_f7c378e/), the per-kernel split at 1x32768 hk16_hv16 / hk16_hv64 and at hk16_hv16 32k_8seq,
# then the live buffers at the training step's peak of the three GQA rows still over 1.25x flash-qla's memory.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
export QLABENCH_GIT_COMMIT=$(cat .device/s32/HEAD)
d=/tmp/final_$t0; mkdir -p $d
pk() { tar -C $d -cf $OUT/final.tar .; }
run() {  # name timeout args...
  local name=$1 lim=$2; shift 2
  timeout $lim python -m qlabench run --arch sm90 --no-progress --out $d/$name.json "$@" > $d/$name.log 2>&1
  echo "$name rc $? at $(el) s"; pk
}
run bwd 150 --sweep h200-bwd --phase bwd --backends qla
run fwdbwd 180 --sweep h200-bwd --phase fwdbwd --backends qla
run split 120 --cfg hk16_hv16 --cfg hk16_hv64 --seqlens 1x32768 --phase bwd --backends qla --kernel-split
run split8 60 --cfg hk16_hv16 --seqlens 32k_8seq --phase bwd --backends qla --kernel-split
for a in "3274+1029+2909+5061+2011+3793+9932+4759 fwdbwd 2 4" "3274+1029+2909+5061+2011+3793+9932+4759 fwdbwd 4 8" "7053+1139 fwdbwd 8 16"; do
  set -- $a; timeout 100 python .device/s32/memsnap.py $1 $2 $3 $4 > $d/mem_hk$3_hv$4_$(echo $1 | tr -cd + | wc -c)_$2.txt 2>&1
  echo "memsnap $a rc $? at $(el) s"; pk
done
grep -A14 "BENCHMARKS" $d/bwd.log | tail -12
grep -B3 -A24 "PER-KERNEL" $d/split.log | head -45
grep -A20 "PER-KERNEL" $d/split8.log | head -24
for f in $d/mem_*.txt; do head -12 $f; done
echo "done at $(el) s"
