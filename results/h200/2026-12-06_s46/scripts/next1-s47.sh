#!/usr/bin/env bash
# Prepared in session 46 for the next GPU session. Trees in .device/s47/trees (COMMITS): main = 113f67c (kernels of
# 9edf826: the factors-only kernel per chunk), rows = wip/s46-dht-rows (536940b: the CP backward's terminal-gradient
# rows in one launch of common/cp_rows.dht_rows in place of torch's fill + index_copy_; host + one small kernel).
# 1. rows' own GPU test (kernel against its torch form, bit for bit).
# 2. h200-bwd phase bwd, main against rows and rows against main (only the CP rows can move: 22 of 40).
#    On an H200 the main runs are also the 3x figure (report them against the stored H200 peers).
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s47"],
# command "bash .device/gpu-env.sh bash .device/s47/next1.sh", timeout_s 600 (results/ moved out first)
set -u
. .device/s47/common.sh
call_setup n1
cat $d/gpu.txt
(cd $TR/rows && PYTHONPATH=$TR/rows timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_cp_rows.py) \
  > $d/cp_rows_gpu.log 2>&1; echo "cp_rows gpu test rc $? ($(tail -1 $d/cp_rows_gpu.log))"
run b_main 200 main --sweep h200-bwd --phase bwd --backends qla
run b_rows 200 rows --sweep h200-bwd --phase bwd --backends qla
run b_rows2 200 rows --sweep h200-bwd --phase bwd --backends qla
run b_main2 200 main --sweep h200-bwd --phase bwd --backends qla
python -m qlabench compare $d/b_main.json $d/b_rows.json > $d/cmp_bwd.txt 2>&1
python -m qlabench compare $d/b_main2.json $d/b_rows2.json > $d/cmp_bwd2.txt 2>&1
echo "== bwd rows / main"; grep -hE "verdicts|qla:" $d/cmp_bwd.txt $d/cmp_bwd2.txt
pk
echo "done at $(el) s"
