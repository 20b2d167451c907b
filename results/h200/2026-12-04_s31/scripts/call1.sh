#!/usr/bin/env bash
# Session 31 call 1: bwd_fused forced on hk16_hv16 h200-bwd, QLABENCH_T_SVROW x QLABENCH_T_DEFER (4 variants, 2 rounds for 00).
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
d=$OUT/c1; mkdir -p $d
head=$(cat .device/s32/HEAD)
run() {  # name svrow defer
  local name=$1 s=$2 f=$3
  QLABENCH_T_SVROW=$s QLABENCH_T_DEFER=$f QLABENCH_GIT_COMMIT=$head+sv$s+df$f timeout 150 python -m qlabench run --arch sm90 --no-progress \
    --out $d/$name.json --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla:cp=on+bwd_dh=fused > $d/$name.log 2>&1; echo "$name rc $? at $(el) s"
}
run f00 0 0
run f01 0 1
run f10 1 0
run f11 1 1
run f00b 0 0
for v in f01 f10 f11 f00b; do echo "== $v"; python -m qlabench compare $d/f00.json $d/$v.json > $d/cmp_$v.txt 2>&1; tail -14 $d/cmp_$v.txt; done
grep -A12 "ACCURACY" $d/f11.log | tail -10
