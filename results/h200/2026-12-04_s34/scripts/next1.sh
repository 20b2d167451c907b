#!/usr/bin/env bash
# Prepared in session 34 for the next GPU session's first call (any checkout: every variant runs from a tree).
# bwd_dh_ws v5 (wip/s34-dh: v4 + eDO by ldmatrix + dh / dV' row stores by TMA from the producer) alone against v4
# and main (old); bwd_h_ws htma (wip/s34-htma: h stored by TMA from the producer) alone against main; one process per
# run with a hard kill (a hang costs 45 s, not the call); v5 probed (wip/s34-dh-probe). Then, from the tree "both" (wip/s34-both = v5 + htma), the
# GPU tests of bwd_dh_ws (structure + A/B against bwd_dh_pipelined and its twin), bwd_h_ws, the backward, the CP
# backward and dg stress.
#   device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz",
#   ".device/s34", ".device/gpu-tests"], command "bash .device/gpu-env.sh bash .device/s34/next1.sh", timeout_s 420
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
for f in tests/kernels/test_backward_gpu.py tests/kernels/test_backward_cp_gpu.py tests/kernels/test_dg_stress_gpu.py; do
  (timeout -s KILL 200 python -m pytest -q -m gpu -p no:cacheprovider $f > $d/t_$(basename $f .py).log 2>&1
   echo "exit $?" >> $d/t_$(basename $f .py).log) &
done
wait
echo "tests at $(el) s"; pk
for f in $d/t_*.log; do echo "$f: $(grep -E "passed|failed" $f | tail -1) $(tail -1 $f)"; grep -E "^FAILED|^E  .*rel" $f | head -6; done
