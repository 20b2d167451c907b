#!/usr/bin/env bash
# Session 31 call 3 at HEAD: hk16_hv16 h200-bwd, phases fwdbwd and bwd, cp=auto (the default) against cp=on with
# bwd_fused forced (the CP training rule's refit for bwd_fused), peak memory in the rows.
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
run fwdbwd 150 --sweep h200-bwd --cfg hk16_hv16 --phase fwdbwd --backends qla,qla:cp=on+bwd_dh=fused
run bwd 100 --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla,qla:cp=on+bwd_dh=fused
grep -B2 -A22 "BENCHMARKS" $d/fwdbwd.log | head -30
grep -B2 -A22 "BENCHMARKS" $d/bwd.log | head -30
echo "done at $(el) s"
