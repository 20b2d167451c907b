#!/usr/bin/env bash
# Session 47, call 2. Trees in .device/s47/trees (COMMITS): main = a6420be (wip/s46-dht-rows merged), gath =
# wip/s47-dh0-gather (43549e5: the CP backward's dh0 of multi-sequence plans by cp_rows.gather_rows in place of torch's
# index gather). 1. cp_rows' GPU test in the gath tree. 2. h200-bwd phase bwd, main / gath in both orders.
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s47"],
# command "bash .device/gpu-env.sh bash .device/s47/next2.sh", timeout_s 600 (results/ moved out first)
set -u
. .device/s47/common.sh
call_setup n2
cat $d/gpu.txt
(cd $TR/gath && PYTHONPATH=$TR/gath:$PYTHONPATH timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_cp_rows.py) \
  > $d/cp_rows_gpu.log 2>&1; echo "cp_rows gpu test rc $? ($(tail -1 $d/cp_rows_gpu.log))"
run b_main 200 main --sweep h200-bwd --phase bwd --backends qla
run b_gath 200 gath --sweep h200-bwd --phase bwd --backends qla
run b_gath2 200 gath --sweep h200-bwd --phase bwd --backends qla
run b_main2 200 main --sweep h200-bwd --phase bwd --backends qla
python -m qlabench compare $d/b_main.json $d/b_gath.json > $d/cmp_bwd.txt 2>&1
python -m qlabench compare $d/b_main2.json $d/b_gath2.json > $d/cmp_bwd2.txt 2>&1
echo "== bwd gath / main"; grep -hE "verdicts|qla:" $d/cmp_bwd.txt $d/cmp_bwd2.txt
pk
echo "done at $(el) s"
