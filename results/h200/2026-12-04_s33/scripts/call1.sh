#!/usr/bin/env bash
# Session 33 call 1: bwd_dh_ws rebuilt on the V-free recursion (dS = e_C dS + Zn^T Yr + Rg^T dO): alone old/new, the GPU
# tests of the backward, then h200-bwd phase bwd (qla) new / old / new and the split at 1x32768.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
head=$(cat .device/s33/HEAD)
d=/tmp/c1_$t0; mkdir -p $d
pk() { tar -C $d -cf $OUT/c1.tar .; }
TR=$PWD/.device/s33/trees
for c in "16 64 64" "16 64 32" "16 32 64" "16 16 32"; do
  for t in new old; do
    pp=$PWD; [ $t = new ] || pp=$TR/$t
    echo "== $t $c" >> $d/alone.txt
    PYTHONPATH=$pp:$PYTHONPATH timeout 60 python .device/s33/dh_alone.py $c >> $d/alone.txt 2>&1
  done
done
echo "alone at $(el) s"; pk; grep -v INFO $d/alone.txt
for f in tests/kernels/test_bwd_dh_ws_compile.py tests/kernels/test_backward_gpu.py tests/kernels/test_backward_cp_gpu.py tests/kernels/test_dg_stress_gpu.py; do
  (timeout 330 python -m pytest -q -m gpu -p no:cacheprovider $f > $d/t_$(basename $f .py).log 2>&1; echo "exit $?" >> $d/t_$(basename $f .py).log) &
done
wait
echo "tests at $(el) s"; pk
for f in $d/t_*.log; do echo "$f: $(grep -E "passed|failed" $f | tail -1) $(tail -1 $f)"; grep -E "^FAILED|^E  .*rel|Error" $f | head -8; done
run() {  # name timeout pythonpath commit-suffix args...
  local name=$1 lim=$2 pp=$3 sfx=$4; shift 4
  PYTHONPATH=$pp:$PYTHONPATH QLABENCH_GIT_COMMIT=$head$sfx timeout $lim python -m qlabench run --arch sm90 --no-progress --out $d/$name.json "$@" > $d/$name.log 2>&1
  echo "$name rc $? at $(el) s"; pk
}
R="--sweep h200-bwd --phase bwd --backends qla"
run b_new 120 $PWD "" $R
run b_old 120 $TR/old "+olddh" $R
run sp_new 90 $PWD "" --cfg hk16_hv32 --cfg hk16_hv64 --seqlens 1x32768 --phase bwd --backends qla --kernel-split
python -m qlabench compare $d/b_old.json $d/b_new.json > $d/cmp.txt 2>&1; pk
tail -14 $d/cmp.txt
grep -B3 -A24 "PER-KERNEL" $d/sp_new.log | head -40
echo "done at $(el) s"
