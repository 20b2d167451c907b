#!/usr/bin/env bash
# Prepared in session 26: the h200-bwd figures at the merged code (the checkout), phases bwd and fwdbwd, and the
# per-kernel split at 1x32768 hk16_hv16 / hk16_hv64; outputs in one tar. Before the call: compile the merged
# kernels for the six presets on the CPU (qlabench aot), repack .device/tlcache.tar.xz, and write the commit:
# git rev-parse --short HEAD > .device/s26/HEAD (the device's .git copy is stale).
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
head=$(cat .device/s26/HEAD); mkdir -p /tmp/m
run() {  # name timeout args...
  local name=$1 lim=$2; shift 2
  QLABENCH_GIT_COMMIT=$head timeout $lim python -m qlabench run --arch sm90 --backends qla --no-progress \
    --out /tmp/m/$name.json "$@" > /tmp/m/$name.log 2>&1
  echo "$name rc $? at $(el) s"; tar -C /tmp/m -cf $OUT/m.tar .
}
run bwd 110 --sweep h200-bwd --phase bwd
run fwdbwd 150 --sweep h200-bwd --phase fwdbwd
run split 100 --cfg hk16_hv16,hk16_hv64 --seqlens 1x32768 --phase bwd --kernel-split
