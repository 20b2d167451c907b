#!/usr/bin/env bash
# Session 49, call 2: on an H200 the figure (h200-bwd phases bwd and fwdbwd, qla, tree main = cbc6359, the
# kernels of 51363db); on any other card the per-kernel split (torch.profiler) of phase bwd, qla only (a short call), at
# rows that hold the gap to 3x (hk16_hv32 / hk16_hv16 x 8k_4seq / 32k_4seq).
set -u
. .device/s49/common.sh
call_setup call2
cat $d/gpu.txt
if grep -q "H200" $d/gpu.txt; then
  run b_fig 200 main --sweep h200-bwd --phase bwd --backends qla
  run fb_fig 250 main --sweep h200-bwd --phase fwdbwd --backends qla
else
  run split 100 main --cfg hk16_hv32,hk16_hv16 --seqlens 8k_4seq,32k_4seq --phase bwd --backends qla --kernel-split
fi
echo "done at $(el) s"
