#!/usr/bin/env bash
# Session 44: half of the GPU test files (the whole suite at once took 474-556 s per file on session 44's H200, and
# its per-file timeout of 560 s cut test_forward_gpu.py). Part a: the backward files; part b: the rest.
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s45"],
# command "bash .device/gpu-env.sh bash .device/s45/suite_part.sh a|b", timeout_s 600
set -u
t0=$(date +%s)
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu-$1.txt 2>&1
all=$(grep -rlE "mark\.gpu|pytestmark.*gpu" tests --include='test_*.py' | sort)
if [ "$1" = a ]; then files=$(echo "$all" | grep -E "backward|bwd_|dg_stress"); else files=$(echo "$all" | grep -vE "backward|bwd_|dg_stress"); fi
tmp=$(mktemp -d)
for f in $files; do
  (timeout 570 python3 -m pytest -q -m gpu -p no:cacheprovider "$f" > "$tmp/$(echo "$f" | tr / _).log" 2>&1
   echo "exit $?" >> "$tmp/$(echo "$f" | tr / _).log") &
done
wait
rc=0
for f in $files; do
  log="$tmp/$(echo "$f" | tr / _).log"
  code=$(tail -n 1 "$log" | awk '{print $2}')
  case "$code" in 0|5) ;; *) rc=1 ;; esac
  printf '%-55s exit %-3s %s\n' "$f" "$code" "$(grep -E "passed|failed|error|skipped|no tests ran|deselected" "$log" | tail -n 1)"
  grep -E "^FAILED|^ERROR" "$log" | head -n 20
done > $OUT/gpu-tests-$1-summary.txt
cat $OUT/gpu-tests-$1-summary.txt
cat "$tmp"/*.log > "$OUT/gpu-tests-$1.log"
echo "part $1 exit $rc (wall $(( $(date +%s) - t0 )) s)" | tee -a $OUT/gpu-tests-$1-summary.txt
