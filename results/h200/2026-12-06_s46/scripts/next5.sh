#!/usr/bin/env bash
# Session 46, call 5: h200-bwd phase bwd, main (cur) against fk (wip/s46-factors-kernel: bwd_prepare's factors-only
# kernel as one block per chunk over every v-head), once each (the device time left allows no second pair).
set -u
. .device/s46/common.sh
call_setup n5
cat $d/gpu.txt
run b_cur 200 cur --sweep h200-bwd --phase bwd --backends qla
run b_fk 200 fk --sweep h200-bwd --phase bwd --backends qla
python -m qlabench compare $d/b_cur.json $d/b_fk.json > $d/cmp_bwd.txt 2>&1
echo "== bwd fk / cur"; grep -hE "verdicts|qla:" $d/cmp_bwd.txt
pk
echo "done at $(el) s"
