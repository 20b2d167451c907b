#!/usr/bin/env bash
# Prepared in session 36 for the next GPU session's second call: the per-kernel split next to the peers at 1x32768
# (hk16_hv32, hk16_hv64, hk16_hv16), ours next to flash-qla's and FLA Triton's. The peers compile / autotune on their
# first calls (session 36's 100 s limit ended after qla's first row): one process per preset, 170 s each.
#   args: the checkout's commit. Output in $OUT (sp_<cfg>.json / .log, written row by row).
#   device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s36"],
#   command "bash .device/gpu-env.sh bash .device/s36/next2.sh <commit>", timeout_s 600
set -u
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache QLABENCH_GIT_COMMIT=$1
t0=$(date +%s)
for c in hk16_hv32 hk16_hv64 hk16_hv16; do
  timeout -s KILL 170 python -m qlabench run --arch sm90 --no-progress --cfg $c --seqlens 1x32768 --phase bwd \
    --backends qla,flash_qla,fla --kernel-split --out $OUT/sp_$c.json > $OUT/sp_$c.log 2>&1
  echo "$c rc $? at $(( $(date +%s) - t0 )) s"
  grep -E "^bwd|_kernel|^sum|^median" $OUT/sp_$c.log | head -30
done
