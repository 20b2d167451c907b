#!/usr/bin/env bash
# Session 49: on an H200 first the figure (h200-bwd phases bwd and fwdbwd, qla, tree main = cbc6359, the
# kernels of 51363db). On any card the A/B of probe (wip/s49-dh-rs: bwd_dh_ws at BV 64 with the state transposed,
# the chain's two GEMMs from registers) against main: its GPU test (bwd_dh_ws against bwd_dh_pipelined and the
# float64 twin), h200-bwd phase bwd of both trees (main's = b_fig on an H200), compare; the same for probe2
# (wip/s49-dh-rs at 8a259fb: bwd_h_ws transposed at BV 64 as well; the checkout); then probe2's split.
set -u
. .device/s49/common.sh
call_setup call
cat $d/gpu.txt
if grep -q "H200" $d/gpu.txt; then
  run b_fig 200 main --sweep h200-bwd --phase bwd --backends qla
  run fb_fig 250 main --sweep h200-bwd --phase fwdbwd --backends qla
  cp $d/b_fig.json $d/b_main.json
else
  run b_main 150 main --sweep h200-bwd --phase bwd --backends qla
fi
timeout -s KILL 150 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_bwd_dh_ws_compile.py > $d/probe_test.log 2>&1  # the checkout is the probe
echo "probe test rc $? at $(el) s"; tail -3 $d/probe_test.log
run b_probe 150 probe --sweep h200-bwd --phase bwd --backends qla
PYTHONPATH=$TR/main:$PYTHONPATH python $S/qrun.py compare $d/b_main.json $d/b_probe.json > $d/cmp.txt 2>&1; tail -n 8 $d/cmp.txt; pk
run b_probe2 150 probe2 --sweep h200-bwd --phase bwd --backends qla
PYTHONPATH=$TR/main:$PYTHONPATH python $S/qrun.py compare $d/b_main.json $d/b_probe2.json > $d/cmp2.txt 2>&1; tail -n 8 $d/cmp2.txt; pk
run split 120 probe2 --cfg hk16_hv32,hk16_hv16 --seqlens 8k_4seq,32k_4seq --phase bwd --backends qla,flash_qla --kernel-split
echo "done at $(el) s"
