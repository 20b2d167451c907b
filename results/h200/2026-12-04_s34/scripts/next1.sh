#!/usr/bin/env bash
# Prepared in session 34 for the next GPU session's first call (any checkout: every variant runs from a tree).
# bwd_dh_ws v5 (wip/s34-dh: v4 + eDO by ldmatrix + dh / dV' row stores by TMA from the producer) alone against v4
# and main (old); bwd_h_ws htma (wip/s34-htma: h stored by TMA from the producer) alone against main; one process per
# run with a hard kill (a hang costs 45 s, not the call); v5 probed (wip/s34-dh-probe). Then, from the tree "both" (wip/s34-both = v5 + htma), the
# GPU tests of bwd_dh_ws (structure + A/B against bwd_dh_pipelined and its twin), the backward and the CP backward
# (dg stress: in the final suite). If they pass and v5 is faster alone: h200-bwd phase bwd (qla) old / both through
# qrun.py and the split at 1x32768 (next2.sh has the rest: v5 alone in the API, old again, forced V tiles).
#   device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz",
#   ".device/s34", ".device/gpu-tests"], command "bash .device/gpu-env.sh bash .device/s34/next1.sh", timeout_s 600
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
d=/tmp/n1_$t0; mkdir -p $d
pk() { tar -C $d -cf $OUT/n1.tar .; }
[ -d .device/s34/trees ] || tar -xJf .device/s34/trees.tar.xz -C .device/s34/
TR=$PWD/.device/s34/trees
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $d/gpu.txt 2>&1
for c in "16 64 64" "16 32 64" "16 16 32"; do
  for t in old v4 both; do
    echo "== $t $c" >> $d/alone.txt
    PYTHONPATH=$TR/$t:$PYTHONPATH timeout -s KILL 45 python .device/s34/dh_alone.py $c >> $d/alone.txt 2>&1
    echo "rc $?" >> $d/alone.txt; pk
  done
done
for c in "16 64 64" "16 32 64" "16 16 32"; do
  for t in old htma; do
    echo "== $t $c" >> $d/h_alone.txt
    PYTHONPATH=$TR/$t:$PYTHONPATH timeout -s KILL 45 python .device/s34/h_alone.py $c >> $d/h_alone.txt 2>&1
    echo "rc $?" >> $d/h_alone.txt; pk
  done
done
for c in "16 64 64" "16 16 32"; do  # v5 with clock64 phase sums (wip/s34-dh-probe)
  echo "== probe $c" >> $d/probe.txt
  PYTHONPATH=$TR/probe:$PYTHONPATH timeout -s KILL 45 python .device/s34/dh_alone.py $c >> $d/probe.txt 2>&1
  echo "rc $?" >> $d/probe.txt; pk
done
echo "alone at $(el) s"; grep -v INFO $d/alone.txt $d/h_alone.txt | grep -v ":  "; grep -v INFO $d/probe.txt
cd $TR/both
timeout -s KILL 150 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_bwd_dh_ws_compile.py > $d/t_dhws.log 2>&1
echo "dh_ws tests rc $? at $(el) s"; pk; grep -E "passed|failed|^E .*rel|^FAILED" $d/t_dhws.log | head
for f in tests/kernels/test_backward_gpu.py tests/kernels/test_backward_cp_gpu.py; do  # dg stress: in the final suite
  (timeout -s KILL 200 python -m pytest -q -m gpu -p no:cacheprovider $f > $d/t_$(basename $f .py).log 2>&1
   echo "exit $?" >> $d/t_$(basename $f .py).log) &
done
wait
echo "tests at $(el) s"; pk
for f in $d/t_*.log; do echo "$f: $(grep -E "passed|failed" $f | tail -1) $(tail -1 $f)"; grep -E "^FAILED|^E  .*rel" $f | head -6; done
cd - > /dev/null
# gate: every test file passed and v5 (tree both) is faster alone at (16, 64, 64) and (16, 16, 32) -> the API A/B
go=$(python - "$d" <<'PY'
import re, sys
d = sys.argv[1]
logs = [open(f"{d}/t_{n}.log").read() for n in ("test_backward_gpu", "test_backward_cp_gpu")]
dh = open(f"{d}/t_dhws.log").read()
ok = all(log.rstrip().endswith("exit 0") for log in logs) and " passed" in dh and not re.search(r" (failed|error)", dh)
step = {}
for block in open(f"{d}/alone.txt").read().split("== ")[1:]:
    name, *rest = block.split("\n")
    m = re.search(r"has_skip 0: [0-9.]+ us, ([0-9.]+) us per", block)
    if m:
        step[tuple(name.split())] = float(m.group(1))
faster = all(step.get(("both", *c), 1e9) < step.get(("old", *c), 0) for c in (("16", "64", "64"), ("16", "16", "32")))
print("yes" if ok and faster else "no")
PY
)
echo "gate: $go ($(el) s)"
[ "$go" = yes ] || exit 0
export QLABENCH_CONFIG_DIR=$PWD/configs
run() {  # name timeout tree commit args...
  local name=$1 lim=$2 tree=$3 commit=$4; shift 4
  PYTHONPATH=$TR/$tree:$PYTHONPATH QLABENCH_GIT_COMMIT=$commit timeout -s KILL $lim python .device/s34/qrun.py run \
    --arch sm90 --no-progress --out $d/$name.json "$@" > $d/$name.log 2>&1
  echo "$name rc $? at $(el) s ($(head -1 $d/$name.log))"; pk
}
R="--sweep h200-bwd --phase bwd --backends qla"
run b_old 110 old c0557b7 $R
run b_both 110 both wip-s34-both $R
python -m qlabench compare $d/b_old.json $d/b_both.json > $d/cmp_both.txt 2>&1; pk
echo "== both vs old"; grep -E "FASTER|SLOWER|geomean" $d/cmp_both.txt | head -50
run sp_both 80 both wip-s34-both --cfg hk16_hv32 --cfg hk16_hv64 --seqlens 1x32768 --phase bwd --backends qla --kernel-split
grep -B3 -A24 "PER-KERNEL" $d/sp_both.log | head -40
echo "done at $(el) s"
