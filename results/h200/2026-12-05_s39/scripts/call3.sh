#!/usr/bin/env bash
# Session 39, call 3 (the budget left after refusals): the per-kernel split (torch.profiler device time,
# --kernel-split) of ours (main's kernels, the cur tree) at hk16_hv16 8k_4seq (the worst FLA row of the h200-bwd
# matrix, bwd_chunk's path) and 8k_1seq (the CP path), then FLA Triton's at 8k_4seq if time is left.
# device run: carry as call1.sh, command "bash .device/gpu-env.sh bash .device/s39/call3.sh", timeout_s 120
set -u
. .device/s39/common.sh
call_setup c3
run split_qla 70 cur --cfg hk16_hv16 --seqlens 8k_4seq,8k_1seq --phase bwd --backends qla --kernel-split
[ $(el) -lt 60 ] && run split_fla 45 cur --cfg hk16_hv16 --seqlens 8k_4seq --phase bwd --backends fla --kernel-split
for n in qla fla; do python -m qlabench report $d/split_$n.json --format md > $d/split_$n.md 2> $d/split_$n.err; done
pk
echo "done at $(el) s"
