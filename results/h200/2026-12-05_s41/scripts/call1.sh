#!/usr/bin/env bash
# Session 41, call 1: the whole GPU suite at main 25b8923 (cp_correct into per-piece rows landed), then on an H200
# main's h200-bwd phase bwd (qla), on an H100 the per-kernel split (torch.profiler device time) of main at the small
# GQA presets' CP rows (hk4_hv8, hk2_hv4; bwd).
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz",
# ".device/gpu-tests", ".device/s41"], command "bash .device/s41/call1.sh", timeout_s 600
set -u
t0=$(date +%s)
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt 2>&1
bash .device/gpu-env.sh bash .device/gpu-tests > $OUT/gpu-tests-summary.txt 2>&1
echo "exit status $? (wall $(( $(date +%s) - t0 )) s)" >> $OUT/gpu-tests-summary.txt
cat $OUT/gpu-tests-summary.txt
export QLABENCH_GIT_COMMIT=25b8923
left=$(( 585 - ($(date +%s) - t0) ))
if grep -q H200 $OUT/gpu.txt; then
  # an H200: main's h200-bwd phase bwd (qla) for the report against the stored H200 peers
  timeout -s KILL $left bash .device/gpu-env.sh python -m qlabench run --arch sm90 --no-progress --sweep h200-bwd \
    --phase bwd --backends qla --out $OUT/h200_bwd_qla.json > $OUT/h200_bwd_qla.log 2>&1
  echo "sweep rc $? at $(( $(date +%s) - t0 )) s"; tail -n 5 $OUT/h200_bwd_qla.log
else
  timeout -s KILL $left bash .device/gpu-env.sh python -m qlabench run --arch sm90 --no-progress \
    --cfg hk4_hv8,hk2_hv4 --seqlens 8k_1seq,8k_2seq,32k_1seq --phase bwd --backends qla --kernel-split \
    --out $OUT/split_small.json > $OUT/split_small.log 2>&1
  bash .device/gpu-env.sh python - $OUT/split_small.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    ks = r.get("kernel_split") or {}
    print(r["preset"], r["pattern"], r["status"], round(r["median_ms"] or 0, 3), "sum", round(sum(ks.values()), 1))
    for k, v in sorted(ks.items(), key=lambda x: -x[1])[:14]:
        print(f"   {v:8.1f}  {k[:90]}")
PY
fi
echo "done at $(( $(date +%s) - t0 )) s"
