#!/usr/bin/env bash
# Session 40, call 3: the backward's own CP (bwd_cp=on: piece states recomputed, bwd_fused where H_v == H_qk and <= 56
# chains) against the default (bwd_cp=auto: no plan at these rows) on main's kernels, phase bwd, rows whose forward
# takes no CP and whose h / dh phase is paced by the longest sequence's chain (split of call 2).
# device run: carry as call1.sh, command "bash .device/gpu-env.sh bash .device/s40/call3.sh", timeout_s 300
set -u
. .device/s40/common.sh
call_setup c3
B="--phase bwd --backends qla,qla:bwd_cp=on --warmup 5 --repeats 40"
run a16 70 cur --cfg hk16_hv16 --seqlens 8k_4seq,8k_8seq $B
run a8 70 cur --cfg hk8_hv16 --seqlens 8k_4seq,32k_8seq $B
run a32 80 cur --cfg hk16_hv32 --seqlens 8k_1seq,32k_1seq $B
python - $d <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/a*.json")):
    rows = json.load(open(f))["rows"]
    t = {}
    for r in rows:
        t.setdefault((r["preset"], r["pattern"]), {})[r["backend"]] = (round(r["median_ms"], 3), r["status"])
    for k, v in t.items():
        print(k, v)
PY
pk
echo "done at $(el) s"
