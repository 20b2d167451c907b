#!/usr/bin/env bash
# Session 40, call 5: the CP backward's glue (wip/s40-glue: bwd_fused reads dht_all through its chain table, no
# gathered dht_pieces; the local pass's dht rows by a fill and a row copy) against main (cur), phase bwd, CP rows.
# device run: carry as call1.sh, command "bash .device/gpu-env.sh bash .device/s40/call5.sh", timeout_s 220
set -u
. .device/s40/common.sh
call_setup c5
B="--cfg hk16_hv16,hk8_hv16,hk2_hv4 --seqlens 8k_1seq,32k_1seq --phase bwd --backends qla --warmup 5 --repeats 60"
run b_cur 80 cur $B
run b_glue 80 glue $B
python -m qlabench compare $d/b_cur.json $d/b_glue.json > $d/cmp_glue.txt 2>&1
grep -E "qla|geomean|verdicts" $d/cmp_glue.txt | head -12
python - $d <<'PY'
import json, sys
for n in ("b_cur", "b_glue"):
    rows = json.load(open(f"{sys.argv[1]}/{n}.json"))["rows"]
    print(n, [(r["preset"], r["pattern"], r["status"], round(r["median_ms"], 4), round(r.get("peak_mem_mb") or 0, 1)) for r in rows])
PY
pk
echo "done at $(el) s"
