#!/usr/bin/env bash
# Session 50, call 4 (tree lanes = wip/s50-lanes at the commit in COMMITS: the backward's lanes, auto where the
# longest chain's two recurrences leave half the SMs; same kernels as main). On an H200: the figure at lanes
# (h200-bwd phases bwd and fwdbwd, qla), then lanes off in the same tree (main's launches) for the A/B. On any other
# card: lanes auto against off, h200-bwd phase bwd. Then on any card: hk16_hv16 / hk8_hv16 8k_4seq (BV 32 rows, lanes
# off by the rule) with BV 64 and lanes forced on against auto; the backward GPU tests with lanes forced on.
set -u
. .device/s50/common.sh
call_setup call4
cat $d/gpu.txt
cmp() { PYTHONPATH=$TR/main:$PYTHONPATH python $S/qrun.py compare $d/$1.json $d/$2.json > $d/cmp_$2_$1.txt 2>&1; tail -n 4 $d/cmp_$2_$1.txt; pk; }
if grep -q "H200" $d/gpu.txt; then
  run b_fig 200 lanes --sweep h200-bwd --phase bwd --backends qla
  run fb_fig 250 lanes --sweep h200-bwd --phase fwdbwd --backends qla
  QLABENCH_BWD_LANES=off run b_off 150 lanes --sweep h200-bwd --phase bwd --backends qla
  cmp b_off b_fig
else
  QLABENCH_BWD_LANES=off run b_off 150 lanes --sweep h200-bwd --phase bwd --backends qla
  run b_auto 150 lanes --sweep h200-bwd --phase bwd --backends qla
  cmp b_off b_auto
fi
run s_auto 60 lanes --cfg hk16_hv16,hk8_hv16 --seqlens 8k_4seq,8k_8seq --phase bwd --backends qla
QLABENCH_BWD_BV=64 QLABENCH_BWD_LANES=on run s_bv64 60 lanes --cfg hk16_hv16,hk8_hv16 --seqlens 8k_4seq,8k_8seq --phase bwd --backends qla
cmp s_auto s_bv64
QLABENCH_BWD_LANES=on timeout -s KILL 120 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_backward_gpu.py > $d/lanes_test.log 2>&1
echo "lanes test rc $? at $(el) s"; tail -2 $d/lanes_test.log; pk
echo "done at $(el) s"
