#!/usr/bin/env bash
# Session 30 call 1: bwd_fused clock64 phase timing (wip/s30 = main + wip-s30-prep.patch) at 1x32768 hk16_hv16
# under the store / scalar-load switches.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
d=$OUT/timing; mkdir -p $d
run() { local name=$1; shift; env "$@" timeout 90 python .device/s30/timing.py 32768 > $d/$name.txt 2>&1; echo "$name rc $? at $(el) s"; }
run base X=0
run nostore QLABENCH_T_NOSTORE=1
run prefetch QLABENCH_T_SCALARS_PREFETCH=1
run tma QLABENCH_T_TMA_STORE=1
run prefetch_tma QLABENCH_T_SCALARS_PREFETCH=1 QLABENCH_T_TMA_STORE=1
run prefetch_nostore QLABENCH_T_SCALARS_PREFETCH=1 QLABENCH_T_NOSTORE=1
for f in base nostore prefetch tma prefetch_tma prefetch_nostore; do echo "== $f"; grep -v Warn $d/$f.txt | head -40; done
