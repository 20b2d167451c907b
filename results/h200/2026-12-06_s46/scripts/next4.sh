#!/usr/bin/env bash
# Session 46, call 4: h200-bwd phase bwd, main (cur) against fac2 (wip/s46-factors at its second commit: the
# producers issue the gate loads before their wait for the ring slot), in both orders. On an H200 the fac2 runs are
# also the figure (report against the stored H200 peers).
set -u
. .device/s46/common.sh
call_setup n4
cat $d/gpu.txt
run b_cur 200 cur --sweep h200-bwd --phase bwd --backends qla
run b_f2 200 fac2 --sweep h200-bwd --phase bwd --backends qla
run b_f2b 200 fac2 --sweep h200-bwd --phase bwd --backends qla
run b_cur2 200 cur --sweep h200-bwd --phase bwd --backends qla
python -m qlabench compare $d/b_cur.json $d/b_f2.json > $d/cmp_bwd.txt 2>&1
python -m qlabench compare $d/b_cur2.json $d/b_f2b.json > $d/cmp_bwd2.txt 2>&1
echo "== bwd fac2 / cur"; grep -hE "verdicts|qla:" $d/cmp_bwd.txt $d/cmp_bwd2.txt
pk
echo "done at $(el) s"
