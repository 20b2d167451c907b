#!/usr/bin/env bash
# Session 30 call 5: bwd_fused's next-chunk gam / beta loaded into registers at the chunk top (QLABENCH_T_SCALREG=1)
# against main's load at the top (0); dg_tail scan in both. h200-bwd hk16_hv16 bwd, bwd_fused forced; twice each.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
d=$OUT/c5; mkdir -p $d
head=$(cat .device/s30/HEAD)
run() {
  local name=$1 s=$2; shift 2
  QLABENCH_T_SCALREG=$s QLABENCH_GIT_COMMIT=$head+scalreg$s timeout 150 python -m qlabench run --arch sm90 --no-progress \
    --out $d/$name.json "$@" > $d/$name.log 2>&1; echo "$name rc $? at $(el) s"
}
for r in a b; do
  run f0$r 0 --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla:cp=on+bwd_dh=fused
  run f1$r 1 --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla:cp=on+bwd_dh=fused
done
python -m qlabench compare $d/f0a.json $d/f1a.json > $d/compare_a.txt 2>&1
python -m qlabench compare $d/f0b.json $d/f1b.json > $d/compare_b.txt 2>&1
tail -14 $d/compare_a.txt; tail -14 $d/compare_b.txt
grep -A14 "tolerance 0.02" $d/f1a.log | tail -9
