#!/usr/bin/env bash
# Session 50, call 5 [part: all (default) or bwd; per-file timeout (560); the seconds after which s_mem is skipped (520)]: the GPU suite at the checkout (tree cur = the checkout's commit, in COMMITS), every GPU test
# file in parallel (suite_sharded.sh all). On an H200 first the figure, h200-bwd phase bwd, qla (tree cur).
# Then, if the call has time left, hk16_hv16 / hk8_hv16 x 8k_4seq / 8k_8seq phase bwd, qla: the peak memory with h and
# dh a row per real chunk.
set -u
. .device/s50/common.sh
call_setup call5
cat $d/gpu.txt
if [ "${4:-}" = fig ] && grep -q "H200" $d/gpu.txt; then
  run b_fig 90 cur --sweep h200-bwd --phase bwd --backends qla
fi
PER_FILE_TIMEOUT=${2:-560} bash .device/s50/suite_sharded.sh ${1:-all} > $d/suite.out 2>&1
echo "suite done at $(el) s"; tail -n 30 $d/suite.out; pk
if [ $(el) -lt ${3:-520} ]; then
  run s_mem 60 cur --cfg hk16_hv16,hk8_hv16 --seqlens 8k_4seq,8k_8seq --phase bwd --backends qla
fi
echo "done at $(el) s"
