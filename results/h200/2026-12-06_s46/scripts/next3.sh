#!/usr/bin/env bash
# Session 46, call 3: h200-bwd phase bwd, main (cur, 687db98's kernels) against fac (wip/s46-factors: bwd_h / bwd_dh
# form their factor rows from the gates, no bwd_prepare launch after the API's forward), in both orders.
# On an H200 the fac runs are also the figure (report against the stored H200 peers).
set -u
. .device/s46/common.sh
call_setup n3
cat $d/gpu.txt
run b_cur 200 cur --sweep h200-bwd --phase bwd --backends qla
run b_fac 200 fac --sweep h200-bwd --phase bwd --backends qla
run b_fac2 200 fac --sweep h200-bwd --phase bwd --backends qla
run b_cur2 200 cur --sweep h200-bwd --phase bwd --backends qla
for a in "" 2; do python -m qlabench compare $d/b_cur$a.json $d/b_fac$a.json > $d/cmp_bwd$a.txt 2>&1; done
echo "== bwd fac / cur"; grep -hE "verdicts|qla:" $d/cmp_bwd.txt $d/cmp_bwd2.txt
grep -h "status" $d/b_fac.log | head -3
pk
echo "done at $(el) s"
