#!/usr/bin/env bash
# Prepared in session 34 for the next GPU session's second call, if next1.sh's API A/B says both (v5 + htma) is
# faster: h200-bwd phase bwd (qla) through qrun.py (the tree on PYTHONPATH really runs; QLABENCH_CONFIG_DIR for the
# tree): old (main), v5 alone (is htma worth keeping?), both, and both with forced V tiles (does the V-tile model
# need a refit?), all in one call.
#   device run: the carry of next1.sh, command "bash .device/gpu-env.sh bash .device/s34/next2.sh", timeout_s 560 (about 6 minutes)
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
export QLABENCH_CONFIG_DIR=$PWD/configs
d=/tmp/n2_$t0; mkdir -p $d
pk() { tar -C $d -cf $OUT/n2.tar .; }
[ -d .device/s34/trees ] || tar -xJf .device/s34/trees.tar.xz -C .device/s34/
TR=$PWD/.device/s34/trees
run() {  # name timeout tree commit args...
  local name=$1 lim=$2 tree=$3 commit=$4; shift 4
  PYTHONPATH=$TR/$tree:$PYTHONPATH QLABENCH_GIT_COMMIT=$commit timeout -s KILL $lim python .device/s34/qrun.py run \
    --arch sm90 --no-progress --out $d/$name.json "$@" > $d/$name.log 2>&1
  echo "$name rc $? at $(el) s ($(head -1 $d/$name.log))"; pk
}
R="--sweep h200-bwd --phase bwd --backends qla"
# ~70 s per sweep; what finished comes back if the call's limit cuts the rest
run b_old 110 old c0557b7 $R
run b_v5 110 v5 wip-s34-dh $R
run b_both 110 both wip-s34-both $R
# the V-tile model (value_tile.BACKWARD_STEP_US) was fitted to the old bwd_dh / bwd_h steps: both with forced tiles
QLABENCH_BWD_BV=32 run b_both_bv32 110 both wip-s34-both $R
QLABENCH_BWD_BV=64 run b_both_bv64 110 both wip-s34-both $R
for v in v5 both; do python -m qlabench compare $d/b_old.json $d/b_$v.json > $d/cmp_$v.txt 2>&1; done
for v in bv32 bv64; do python -m qlabench compare $d/b_both.json $d/b_both_$v.json > $d/cmp_both_$v.txt 2>&1; done; pk
for v in v5 both both_bv32 both_bv64; do echo "== $v"; grep -E "geomean" $d/cmp_$v.txt | head -5; done
grep -E "FASTER|SLOWER" $d/cmp_both_bv32.txt $d/cmp_both_bv64.txt | head -40
echo "done at $(el) s"
