#!/usr/bin/env bash
# Session 33 call 6: bwd_dh_ws v4 (v3 with Ag read by ldmatrix into the Zn product's A fragment, no selects) alone,
# against main (f257d4d's kernel) in the same call.
set -u
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
d=/tmp/c6; mkdir -p $d
for c in "16 64 64" "16 16 32"; do
  for t in v4 main; do
    pp=$PWD; [ $t = main ] || pp=$PWD/.device/s33/trees/$t
    echo "== $t $c" >> $d/alone6.txt
    PYTHONPATH=$pp:$PYTHONPATH timeout 40 python .device/s33/dh_alone.py $c >> $d/alone6.txt 2>&1
  done
done
cp $d/alone6.txt $OUT/; grep -v INFO $d/alone6.txt
