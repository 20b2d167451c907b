#!/usr/bin/env bash
# Session 49, call 2: on an H200 the figure (h200-bwd phases bwd and fwdbwd, qla, tree main = cbc6359, the
# kernels of 51363db); on any other card the timing probe nozn (bwd_dh_ws without its Zn GEMM, wrong values: the
# upper bound of forming Zn off the recurrence) against main, h200-bwd phase bwd. (Call 2 ran the split here.)
set -u
. .device/s49/common.sh
call_setup call2
cat $d/gpu.txt
if grep -q "H200" $d/gpu.txt; then
  run b_fig 200 main --sweep h200-bwd --phase bwd --backends qla
  run fb_fig 250 main --sweep h200-bwd --phase fwdbwd --backends qla
else
  echo "not an H200: nothing run (calls 2 and 3 ran the split and the nozn probe)"; pk
fi
echo "done at $(el) s"
