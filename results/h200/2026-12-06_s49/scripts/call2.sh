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
else  # a timing probe: nozn (wip/s49-nozn, bwd_dh_ws without its Zn GEMM: wrong values) against main
  run b_main 150 main --sweep h200-bwd --phase bwd --backends qla --cfg hk16_hv32,hk2_hv4,hk16_hv16
  run b_nozn 150 nozn --sweep h200-bwd --phase bwd --backends qla --cfg hk16_hv32,hk2_hv4,hk16_hv16
  PYTHONPATH=$TR/main:$PYTHONPATH python $S/qrun.py compare $d/b_main.json $d/b_nozn.json > $d/cmp.txt 2>&1; tail -n 8 $d/cmp.txt; pk
fi
echo "done at $(el) s"
