#!/usr/bin/env bash
# Session 48: on an H200 the figure (h200-bwd phases bwd and fwdbwd, qla, tree main = de4ca59, the kernels of
# 51363db); on any other card a timing probe: h200-bwd phase bwd, qla, main against probe (wip/s48-pg-onchip,
# 174aeff: bwd_dh_ws forms Pg^T = scale Gam^T .* K Q^T on chip with Gam from e_i / e_j, no Pg load; timing only).
set -u
. .device/s48/common.sh
call_setup call
cat $d/gpu.txt
if grep -q "H200" $d/gpu.txt; then
  run b_fig 200 main --sweep h200-bwd --phase bwd --backends qla
  run fb_fig 250 main --sweep h200-bwd --phase fwdbwd --backends qla
else
  run b_main 150 main --sweep h200-bwd --phase bwd --backends qla
  run b_probe 150 probe --sweep h200-bwd --phase bwd --backends qla
  PYTHONPATH=$TR/main:$PYTHONPATH python $S/qrun.py compare $d/b_main.json $d/b_probe.json > $d/cmp.txt 2>&1; tail -n 25 $d/cmp.txt; pk
fi
echo "done at $(el) s"
