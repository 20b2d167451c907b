#!/usr/bin/env bash
# Session 51: the per-kernel split at 1x32768 hk16_hv16 / hk16_hv64, phase bwd, ours (tree final) next to
# flash-qla, torch.profiler device time per kernel (--kernel-split). Any card.
set -u
. .device/s51/common.sh
call_setup split
cat $d/gpu.txt
run k_split ${SPLIT_LIMIT:-300} final --cfg hk16_hv16,hk16_hv64 --seqlens 1x32768 --phase bwd --backends qla,flash_qla --kernel-split
tail -n 40 $d/k_split.log
echo "done at $(el) s"
