#!/usr/bin/env bash
# Session 30 call 4: dg_tail serial (QLABENCH_T_DGSCAN=0, main's) against the one-warp shuffle version (1):
# h200-bwd phase bwd, qla default on all five presets, then hk16_hv16 with bwd_fused forced.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
d=$OUT/c4; mkdir -p $d
head=$(cat .device/s30/HEAD)
run() {  # name dgscan args...
  local name=$1 s=$2; shift 2
  QLABENCH_T_DGSCAN=$s QLABENCH_GIT_COMMIT=$head+dgscan$s timeout 150 python -m qlabench run --arch sm90 --no-progress \
    --out $d/$name.json "$@" > $d/$name.log 2>&1; echo "$name rc $? at $(el) s"
}
run all0 0 --sweep h200-bwd --phase bwd --backends qla
run all1 1 --sweep h200-bwd --phase bwd --backends qla
run fused0 0 --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla:cp=on+bwd_dh=fused
run fused1 1 --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla:cp=on+bwd_dh=fused
python -m qlabench compare $d/all0.json $d/all1.json > $d/compare_all.txt 2>&1
python -m qlabench compare $d/fused0.json $d/fused1.json > $d/compare_fused.txt 2>&1
grep -v "^bwd" $d/compare_all.txt | tail -6; grep "SLOWER\|FASTER" $d/compare_all.txt | head -40
tail -14 $d/compare_fused.txt
grep -A12 "ACCURACY" $d/all1.log | tail -10
