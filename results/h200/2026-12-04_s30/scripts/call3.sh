#!/usr/bin/env bash
# Session 30 call 3 (main): live buffers at the backward's peak, hk16_hv16, memory-over rows.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
d=$OUT/c3; mkdir -p $d
for a in "32768 bwd" "7212+25556 bwd" "7212+7072+13725+4759 bwd" "3274+1029+2909+5061+2011+3793+9932+4759 bwd" "7212+25556 fwdbwd"; do
  set -- $a; timeout 100 python .device/s30/memsnap.py $1 $2 > $d/mem_${1//+/_}_$2.txt 2>&1; echo "$a rc $? at $(el) s"
  grep -v Warn $d/mem_${1//+/_}_$2.txt | head -30
done
