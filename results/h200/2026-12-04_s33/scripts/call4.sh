#!/usr/bin/env bash
# Session 33 call 4 (main at 9102b89, kernels of f257d4d): h200-bwd phase bwd (qla) with the V tile of bwd_h / bwd_dh
# chosen by the model (auto), forced to 32, forced to 64, auto again: which tile each row should take.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
export QLABENCH_GIT_COMMIT=9102b89
d=/tmp/c4_$t0; mkdir -p $d
pk() { tar -C $d -cf $OUT/c4.tar .; }
run() {  # name timeout env args...
  local name=$1 lim=$2 ev=$3; shift 3
  env $ev timeout $lim python -m qlabench run --arch sm90 --no-progress --out $d/$name.json "$@" > $d/$name.log 2>&1
  echo "$name rc $? at $(el) s"; pk
}
R="--sweep h200-bwd --phase bwd --backends qla"
run auto 120 QLABENCH_BWD_BV=auto $R
run bv32 120 QLABENCH_BWD_BV=32 $R
run bv64 120 QLABENCH_BWD_BV=64 $R
for v in bv32 bv64; do python -m qlabench compare $d/auto.json $d/$v.json > $d/cmp_$v.txt 2>&1; done; pk
for v in bv32 bv64; do echo "== $v"; grep -E "FASTER|SLOWER|geomean|qla:" $d/cmp_$v.txt | head -50; done
echo "done at $(el) s"
