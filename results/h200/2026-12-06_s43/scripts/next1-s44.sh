#!/usr/bin/env bash
# Prepared in session 43 for the next GPU session. Main's kernels = 7641d9d's (09960aa and later: host code only).
# On an H200: h200-bwd phases bwd and fwdbwd, qla (-> reports against the stored H200 peers of 2026-11-29).
# On an H100: h200-bwd phase bwd, qla, then FLA Triton on the same card (resumable: carry a partial fla.json in
# .device/s44/ and it goes on), for a same-card ratio against FLA.
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s44"],
# command "bash .device/gpu-env.sh bash .device/s44/next1.sh COMMIT", timeout_s 600 (results/ moved out first)
set -u
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache QLABENCH_GIT_COMMIT=$1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt 2>&1
q() {  # q NAME LIMIT ARGS...: qlabench run into $OUT/NAME.json / .log
  local name=$1 lim=$2; shift 2
  timeout -s KILL $lim python -m qlabench run --arch sm90 --no-progress --out $OUT/$name.json "$@" > $OUT/$name.log 2>&1
  echo "$name rc $? at $(el) s: $(tail -n 1 $OUT/$name.log)"
}
q hb 200 --sweep h200-bwd --phase bwd --backends qla
if grep -q H200 $OUT/gpu.txt; then
  q hf 200 --sweep h200-bwd --phase fwdbwd --backends qla
else
  res=""
  if [ -f .device/s44/fla.json ]; then cp .device/s44/fla.json $OUT/; res="--resume"; fi
  q fla $(( 585 - $(el) )) --sweep h200-bwd --phase bwd --backends fla $res
fi
echo "done at $(el) s"
