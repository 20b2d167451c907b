#!/usr/bin/env bash
# Session 51 (from session 50's next.sh): tree final = cbc1b04 (COMMITS; the checkout must have its code). On an H200:
# the figure (h200-bwd phases bwd and fwdbwd, qla), the memory rows, then the whole suite with a per-file cap
# that ends before the call's (each shard is killed at the cap, so a short cap shows as exit 124/137, never as a pass).
# On any other card: the memory rows and the whole suite. device run: carry [".device/gpu-env.sh",
# ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s51"], command
# "bash .device/gpu-env.sh bash .device/s51/next.sh", results/ moved out first.
set -u
. .device/s51/common.sh
call_setup next
cat $d/gpu.txt
lim=${CALL_LIMIT:-580}
if grep -q "H200" $d/gpu.txt; then
  run b_fig 150 final --sweep h200-bwd --phase bwd --backends qla
  run fb_fig 200 final --sweep h200-bwd --phase fwdbwd --backends qla
else
  echo "not an H200 (session 53: the H100 suite and memory rows at cbc1b04 are session 51's): nothing run"; pk; exit 0
fi
cap=$(( lim - $(el) - 25 )); [ $cap -gt 560 ] && cap=560
if [ $cap -ge 120 ]; then
  PER_FILE_TIMEOUT=$cap bash .device/s51/suite_sharded.sh all > $d/suite.out 2>&1
  echo "suite (per-file cap $cap s) done at $(el) s"; tail -n 30 $d/suite.out; pk
else
  echo "no time left in this call for the suite: run suite_sharded.sh all in the next call"
fi
echo "done at $(el) s"
