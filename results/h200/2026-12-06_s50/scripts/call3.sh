#!/usr/bin/env bash
# Session 50, call 3. On an H200 first the figure (h200-bwd phases bwd and fwdbwd, qla, tree main = e2553da,
# the kernels of 51363db). On any card then the backward's lanes (tree lanes = wip/s50-lanes, db152e6: same kernels,
# QLABENCH_BWD_LANES=on runs the longest chain's run of sequences and the runs beside it as lanes side by side) against
# the one-launch path (the same tree, lanes off = main's launches), h200-bwd phase bwd, qla; the backward GPU tests
# with lanes on (the checkout is the lanes tree).
set -u
. .device/s50/common.sh
call_setup call3
cat $d/gpu.txt
if grep -q "H200" $d/gpu.txt; then
  run b_fig 200 main --sweep h200-bwd --phase bwd --backends qla
  run fb_fig 250 main --sweep h200-bwd --phase fwdbwd --backends qla
  QLABENCH_BWD_LANES=on run b_on 150 lanes --sweep h200-bwd --phase bwd --backends qla
  PYTHONPATH=$TR/main:$PYTHONPATH python $S/qrun.py compare $d/b_fig.json $d/b_on.json > $d/cmp_on_fig.txt 2>&1; tail -n 6 $d/cmp_on_fig.txt; pk
else
  QLABENCH_BWD_LANES=off run b_off 150 lanes --sweep h200-bwd --phase bwd --backends qla
  QLABENCH_BWD_LANES=on run b_on 150 lanes --sweep h200-bwd --phase bwd --backends qla
  PYTHONPATH=$TR/main:$PYTHONPATH python $S/qrun.py compare $d/b_off.json $d/b_on.json > $d/cmp_on_off.txt 2>&1; tail -n 6 $d/cmp_on_off.txt; pk
fi
QLABENCH_BWD_LANES=on timeout -s KILL 150 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_backward_gpu.py > $d/lanes_test.log 2>&1
echo "lanes test rc $? at $(el) s"; tail -3 $d/lanes_test.log; pk
echo "done at $(el) s"
