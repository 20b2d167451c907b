#!/usr/bin/env bash
# Session 29 call 3: the V tile of bwd_h / bwd_dh (QLABENCH_BWD_BV) over h200-bwd phase bwd, qla: auto, 64, 32; and
# hk16_hv16 with bwd_fused over CP (qla:cp=on+bwd_dh=fused) at 64 and auto.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
head=$(cat .device/s29/HEAD)
d=/tmp/c3_$t0; mkdir -p $d
save() { tar -C $d -cf $OUT/c3.tar .; }
run() {  # name bv timeout args...
  local name=$1 bv=$2 lim=$3; shift 3
  QLABENCH_BWD_BV=$bv QLABENCH_GIT_COMMIT=$head+bv$bv timeout $lim python -m qlabench run --arch sm90 \
    --no-progress --out $d/$name.json "$@" > $d/$name.log 2>&1
  echo "$name rc $? at $(el) s"; save
}
run bv_auto auto 150 --sweep h200-bwd --phase bwd --backends qla
run bv_64 64 150 --sweep h200-bwd --phase bwd --backends qla
run bv_32 32 150 --sweep h200-bwd --phase bwd --backends qla
run fused_64 64 90 --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla:cp=on+bwd_dh=fused
run fused_auto auto 90 --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla:cp=on+bwd_dh=fused
for v in 64 32; do python -m qlabench compare $d/bv_auto.json $d/bv_$v.json > $d/compare_$v.txt 2>&1; done
python -m qlabench compare $d/fused_auto.json $d/fused_64.json > $d/compare_fused.txt 2>&1; save
for v in 64 32 fused; do echo "== $v vs auto"; grep -E "FASTER|SLOWER|geomean|qla" $d/compare_$v.txt | grep -v SAME | tail -30; done
