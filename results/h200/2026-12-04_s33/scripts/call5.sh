#!/usr/bin/env bash
# Session 33 call 5: clock64 phase sums of bwd_dh_ws v3 (377238b, the probe tree) alone at (16, 64, 64) and (16, 16, 32).
set -u
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
d=/tmp/c5; mkdir -p $d
for c in "16 64 64" "16 16 32"; do
  echo "== probe $c" >> $d/probe.txt
  PYTHONPATH=$PWD/.device/s33/trees/probe:$PYTHONPATH timeout 60 python .device/s33/dh_alone.py $c >> $d/probe.txt 2>&1
done
cp $d/probe.txt $OUT/; grep -v INFO $d/probe.txt
