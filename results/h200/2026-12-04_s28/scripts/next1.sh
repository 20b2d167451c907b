#!/usr/bin/env bash
# Prepared in session 27 for the next device session (results/h200/NOTES.md, "session 27's view", item 0). Run it on a
# checkout of branch wip/s27-alpha-rule (or main with it merged): h200-bwd phases bwd and fwdbwd (qla only; the report
# takes the peers from results/h200/2026-11-29_f7c378e/h200-bwd-peers.json), then the whole GPU suite. Its kernels are
# main's (1517bef), all in .device/tlcache.tar.xz: the branch changes host code only (the training plan's piece length).
# Write the commit first: git rev-parse --short HEAD > .device/s27/HEAD. One tar back, appended after each step.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
head=$(cat .device/s27/HEAD); mkdir -p /tmp/n1
run() {  # name timeout args...
  local name=$1 lim=$2; shift 2
  QLABENCH_GIT_COMMIT=$head timeout $lim python -m qlabench run --arch sm90 --backends qla --no-progress \
    --out /tmp/n1/$name.json "$@" > /tmp/n1/$name.log 2>&1
  echo "$name rc $? at $(el) s"; tar -C /tmp/n1 -cf $OUT/n1.tar .
}
run bwd 110 --sweep h200-bwd --phase bwd
run fwdbwd 150 --sweep h200-bwd --phase fwdbwd
echo "suite starts at $(el) s"
bash .device/gpu-tests > /tmp/n1/gpu-tests-summary.txt 2>&1; echo "suite rc $? at $(el) s"
cp $OUT/gpu-tests.log /tmp/n1/ 2>/dev/null; rm -f $OUT/gpu-tests.log
tar -C /tmp/n1 -cf $OUT/n1.tar .
cat /tmp/n1/gpu-tests-summary.txt | grep -E "^tests/|^FAILED|^ERROR"
