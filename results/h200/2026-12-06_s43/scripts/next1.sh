#!/usr/bin/env bash
# Prepared in session 42 for the next GPU session (want an H200: the h200-bwd report compares against the stored H200
# peers of 2026-11-29). Main's kernels = 7641d9d (CP glue / cp_correct tables, GPU suite passed on an H100 in s42).
# 1. h200-bwd, qla, phases bwd and fwdbwd (-> the report against results/h200/2026-11-29_f7c378e/h200-bwd-peers.json);
# 2. the CP rule's boundary with the cheaper glue: QLABENCH_CP=on at the h200-bwd rows cp=auto leaves off with at most
#    56 effective chains, phases bwd and fwdbwd (auto's rows are in 1.'s files, same call).
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s43"],
# command "bash .device/gpu-env.sh bash .device/s43/next1.sh 7641d9d", timeout_s 600 (results/ moved out first)
set -u
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache QLABENCH_GIT_COMMIT=$1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt 2>&1
q() {  # q NAME LIMIT ARGS...: qlabench run into $OUT/NAME.json / .log
  local name=$1 lim=$2; shift 2
  timeout -s KILL $lim python -m qlabench run --arch sm90 --no-progress --backends qla --out $OUT/$name.json "$@" \
    > $OUT/$name.log 2>&1
  echo "$name rc $? at $(el) s: $(tail -n 1 $OUT/$name.log)"
}
q hb 150 --sweep h200-bwd --phase bwd
q hf 150 --sweep h200-bwd --phase fwdbwd
P="--phase bwd,fwdbwd"
export QLABENCH_CP=on
q on_a 90 --cfg hk16_hv32 --seqlens 8k_1seq,8k_2seq,32k_1seq,32k_2seq $P
q on_b 60 --cfg hk8_hv16 --seqlens 8k_4seq,32k_4seq,32k_8seq $P
q on_c 60 --cfg hk16_hv16 --seqlens 8k_4seq $P
q on_d 60 --cfg hk4_hv8,hk2_hv4 --seqlens 8k_8seq $P
unset QLABENCH_CP
python - $OUT <<'PY'
import json, sys, glob
out = sys.argv[1]
auto = {}
for f in ("hb", "hf"):
    try:
        for r in json.load(open(f"{out}/{f}.json"))["rows"]:
            auto[(r["phase"], r["preset"], r["pattern"])] = r
    except Exception as e:
        print(f, e)
for f in sorted(glob.glob(f"{out}/on_*.json")):
    for r in json.load(open(f))["rows"]:
        a = auto.get((r["phase"], r["preset"], r["pattern"]))
        am = a and a["median_ms"]
        om = r["median_ms"]
        print(f'{r["phase"]:7s} {r["preset"]:10s} {r["pattern"]:9s} auto {am} on {om} ratio on/auto '
              f'{(om / am) if (am and om) else None} status {r["status"]} mem {a and a.get("peak_mem_mb")} -> {r.get("peak_mem_mb")}')
PY
echo "done at $(el) s"
