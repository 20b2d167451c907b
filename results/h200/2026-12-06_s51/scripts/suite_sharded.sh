#!/usr/bin/env bash
# Session 45 (copied by 46 for 47; 47 added the return of newly compiled kernels): the whole GPU suite at the checkout's commit in one call, every GPU test file in parallel as
# .device/gpu-tests does, but the files with many tests split into two pytest processes each (node ids dealt
# alternately), so that their kernel compiles use more of the machine's 16 cores and no file nears the call's cap.
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s50"],
# command "bash .device/gpu-env.sh bash .device/s50/suite_sharded.sh", timeout_s 600 (results/ moved out first)
set -u
t0=$(date +%s)
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt 2>&1
git log -1 --format=%H > $OUT/commit.txt 2>/dev/null || true
files=$(grep -rlE "mark\.gpu|pytestmark.*gpu" tests --include='test_*.py' | sort)
# Session 48: an optional part, a or b (half the files each; none: all), so the suite can run as two calls
A="tests/kernels/test_backward_gpu.py tests/kernels/test_bwd_fused_gpu.py tests/kernels/test_forward_cp_gpu.py tests/kernels/test_cp_rows.py tests/test_shard.py tests/perf/test_ci_smoke_perf.py tests/test_gpu_marker.py"
part=${1:-all}
if [ "$part" = a ]; then files=$(for f in $files; do case " $A " in *" $f "*) echo $f;; esac; done); fi
if [ "$part" = b ]; then files=$(for f in $files; do case " $A " in *" $f "*) ;; *) echo $f;; esac; done); fi
# Session 50: part bwd, every GPU file but the forward's and the baselines' (test_forward_gpu, test_forward_cp_gpu,
# test_baselines_gpu: code the session did not change), when the device budget is short of the whole suite
if [ "$part" = bwd ]; then files=$(for f in $files; do case "$f" in *test_forward_gpu.py|*test_forward_cp_gpu.py|*test_baselines_gpu.py) ;; *) echo $f;; esac; done); fi
echo "part $part: $(echo $files | wc -w) files"
tmp=$(mktemp -d)
touch $tmp/marker  # the kernels compiled from here on go back in $OUT/tlcache-new-$part.tar.xz (session 47)
for f in $files; do  # collect every file's GPU node ids at once
  key=$(echo "$f" | tr / _)
  (python3 -m pytest -q -m gpu -p no:cacheprovider --collect-only "$f" 2>/dev/null | grep "::" > "$tmp/$key.ids") &
done
wait
for f in $files; do
  key=$(echo "$f" | tr / _)
  n=$(wc -l < "$tmp/$key.ids")
  if [ "$n" -ge 8 ]; then
    awk 'NR % 2 == 1' "$tmp/$key.ids" > "$tmp/$key.s0"; awk 'NR % 2 == 0' "$tmp/$key.ids" > "$tmp/$key.s1"
    for s in s0 s1; do
      (mapfile -t ids < "$tmp/$key.$s"
       timeout ${PER_FILE_TIMEOUT:-560} python3 -m pytest -q -m gpu -p no:cacheprovider "${ids[@]}" > "$tmp/$key.$s.log" 2>&1
       echo "exit $?" >> "$tmp/$key.$s.log") &
    done
  else
    (timeout ${PER_FILE_TIMEOUT:-560} python3 -m pytest -q -m gpu -p no:cacheprovider "$f" > "$tmp/$key.s0.log" 2>&1
     echo "exit $?" >> "$tmp/$key.s0.log") &
  fi
done
wait
rc=0
for f in $files; do
  key=$(echo "$f" | tr / _)
  for log in "$tmp/$key".s*.log; do
    code=$(tail -n 1 "$log" | awk '{print $2}')
    case "$code" in 0|5) ;; *) rc=1 ;; esac
    printf '%-55s %s exit %-3s %s\n' "$f" "$(basename "$log" .log | sed 's/.*\.//')" "$code" \
      "$(grep -E "passed|failed|error|skipped|no tests ran|deselected" "$log" | tail -n 1)"
    grep -E "^FAILED|^ERROR" "$log" | head -n 20
  done
done > $OUT/gpu-tests-summary-$part.txt
cat $OUT/gpu-tests-summary-$part.txt
cat "$tmp"/*.log > "$OUT/gpu-tests-$part.log"
# Session 47: the kernels the tests compiled (not in the carried archive) come back, so the next session can merge them
# into .device/tlcache.tar.xz and its suite compiles less (bwd_fused's shards took 520 s of the 560 s cap, session 47).
(cd .device && find tlcache -type f -newer $tmp/marker > $tmp/new.txt
 [ -s $tmp/new.txt ] && tar -cf - -T $tmp/new.txt | xz -T16 -6 > $OUT/tlcache-new-$part.tar.xz
 echo "new cache files: $(wc -l < $tmp/new.txt), archive $(du -h $OUT/tlcache-new-$part.tar.xz 2>/dev/null | cut -f1)")
echo "exit status $rc (wall $(( $(date +%s) - t0 )) s)" | tee -a $OUT/gpu-tests-summary-$part.txt
