#!/usr/bin/env bash
# Session 40, call 2: the per-kernel split (torch.profiler device time, --kernel-split) of main's kernels (cur tree)
# at the worst FLA rows of h200-bwd: hk16_hv16 8k_4seq / 8k_1seq (CP + bwd_fused), hk8_hv16 8k_2seq, hk4_hv8 8k_4seq.
# device run: carry as call1.sh, command "bash .device/gpu-env.sh bash .device/s40/call2.sh", timeout_s 300
set -u
. .device/s40/common.sh
call_setup c2
run split16 90 cur --cfg hk16_hv16 --seqlens 8k_4seq,8k_1seq --phase bwd --backends qla --kernel-split
run splitg 80 cur --cfg hk8_hv16,hk4_hv8 --seqlens 8k_2seq,8k_4seq --phase bwd --backends qla --kernel-split
python - $d <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/split*.json")):
    for r in json.load(open(f))["rows"]:
        ks = r.get("kernel_split") or {}
        print(r["preset"], r["pattern"], r["status"], round(r["median_ms"], 3), "sum", round(sum(ks.values()), 1))
        for k, v in sorted(ks.items(), key=lambda x: -x[1]):
            print(f"   {v:8.1f}  {k[:80]}")
PY
pk
echo "done at $(el) s"
