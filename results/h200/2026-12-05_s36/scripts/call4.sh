#!/usr/bin/env bash
# Session 36, call 4: main's fwdbwd sweep (qla) and the per-kernel split next to the peers at 1x32768.
set -u
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache QLABENCH_GIT_COMMIT=$1
t0=$(date +%s)
timeout -s KILL 110 python -m qlabench run --arch sm90 --no-progress --sweep h200-bwd --phase fwdbwd --backends qla \
  --out $OUT/f_cur.json > $OUT/f_cur.log 2>&1; echo "f rc $? at $(( $(date +%s) - t0 )) s"
timeout -s KILL 100 python -m qlabench run --arch sm90 --no-progress --cfg hk16_hv32,hk16_hv16 --seqlens 1x32768 \
  --phase bwd --backends qla,flash_qla,fla --kernel-split --out $OUT/sp_peers.json > $OUT/sp_peers.log 2>&1
echo "sp rc $? at $(( $(date +%s) - t0 )) s"
grep -A30 "PER-KERNEL\|Device time" $OUT/sp_peers.log | head -50
