#!/usr/bin/env bash
# Session 40, call 4: bwd_h_rs (wip/s40-hrs ce0dc09: the state warpgroup holds S^T, both chain products take A from
# registers) against bwd_h_ws: h agreement and the kernels alone (h_rs_alone.py); then the API at V tile 64 forced on
# both sides (QLABENCH_BWD_BV=64), hk16_hv16 32k_1seq / 8k_1seq (CP + bwd_fused: bwd_h is the longer of the two
# recurrences there), phase bwd: cur against hrs with QLABENCH_T_HRS=1.
# device run: carry as call1.sh, command "bash .device/gpu-env.sh bash .device/s40/call4.sh", timeout_s 300
set -u
. .device/s40/common.sh
call_setup c4
PYTHONPATH=$TR/hrs:$PYTHONPATH timeout -s KILL 120 python $S/h_rs_alone.py > $d/alone.txt 2>&1
echo "alone rc $? at $(el) s"; grep -v INFO $d/alone.txt | tail -12; pk
export QLABENCH_BWD_BV=64
B="--cfg hk16_hv16 --seqlens 32k_1seq,8k_1seq --phase bwd --backends qla --warmup 5 --repeats 40"
run b_cur 60 cur $B
export QLABENCH_T_HRS=1
run b_hrs 60 hrs $B
unset QLABENCH_T_HRS QLABENCH_BWD_BV
python -m qlabench compare $d/b_cur.json $d/b_hrs.json > $d/cmp_hrs.txt 2>&1
grep -E "qla|geomean|verdicts" $d/cmp_hrs.txt | head
pk
echo "done at $(el) s"
