#!/usr/bin/env bash
# Prepared in session 35 for the call after next1.sh (argument: the tree of next1's pick.txt "use" line: both,
# ntboth, dh, nt or htma). In order, each with a hard kill; what finished comes back if the call's limit cuts the rest:
#   1. h200-bwd phase bwd (qla), old and the pick: the API A/B (~70 s each);
#   2. the files for the pick: h200-bwd phase fwdbwd, the per-kernel split at 1x32768 (hk16_hv16, hk16_hv32,
#      hk16_hv64) and at every hk16_hv16 pattern (bwd_fused's rows, the lowest FLA group); the bwd sweep of 1 is
#      its phase bwd; the report takes the peers from results/h200/2026-11-29_f7c378e/h200-bwd-peers.json;
#   3. bwd_chunk's GQA loads ahead (tree early = wip/s35-chunk-early: main + that change) against old, then bwd_chunk
#      alone, main's and the clock64 probe build (wip/s35-chunk-probe), ~10 s each;
#   4. the pick with forced V tiles 32 / 64 (does value_tile.BACKWARD_STEP_US need a refit?).
# Sweeps run through qrun.py (the tree on PYTHONPATH really runs). If the pick lands unchanged, 1-2 are the landing's
# measurements (the commit in the JSON is the tree's branch commit: say so in the results README); the next call is
# then the whole GPU suite at the landed commit.
#   device run: the carry of next1.sh, command "bash .device/gpu-env.sh bash .device/s35/next2.sh <tree>", timeout_s 600
set -u
use=${1:?tree name}
. .device/s35/common.sh
call_setup n2
R="--sweep h200-bwd --phase bwd --backends qla"
run b_old 110 old $R
run b_$use 110 $use $R
python -m qlabench compare $d/b_old.json $d/b_$use.json > $d/cmp_$use.txt 2>&1; pk
echo "== $use vs old"; grep -E "FASTER|SLOWER|geomean" $d/cmp_$use.txt | head -50
run f_$use 150 $use --sweep h200-bwd --phase fwdbwd --backends qla
run sp_$use 90 $use --cfg hk16_hv16 --cfg hk16_hv32 --cfg hk16_hv64 --seqlens 1x32768 --phase bwd --backends qla --kernel-split
grep -A40 "PER-KERNEL" $d/sp_$use.log | grep -E "^bwd|kernel|sum|median" | head -40
# hk16_hv16 (bwd_fused's rows, the lowest FLA group at 2.57x): where its time goes at every pattern
run sp16_$use 120 $use --sweep h200-bwd --cfg hk16_hv16 --phase bwd --backends qla --kernel-split
# bwd_chunk's GQA loads ahead (wip/s35-chunk-early, on main's bwd_dh / bwd_h): the API A/B against old; its rows'
# accuracy table is the first GPU check of the change (GQA presets at every pattern)
run b_early 110 early $R
python -m qlabench compare $d/b_old.json $d/b_early.json > $d/cmp_early.txt 2>&1; pk
echo "== early vs old"; grep -E "FASTER|SLOWER|geomean" $d/cmp_early.txt | head -30
grep -E "Over tolerance|non-finite" $d/b_early.log | head -4
# bwd_chunk (half of every GQA row's time, never probed): alone, main's and the clock64 probe build
# (wip/s35-chunk-probe: per warpgroup and phase, cycles per (chunk, v-head) item)
for c in "16 32" "16 64" "16 16"; do
  for t in old cprobe; do
    echo "== $t $c" >> $d/chunk_alone.txt
    PYTHONPATH=$TR/$t:$PYTHONPATH timeout -s KILL 45 python $S/chunk_alone.py $c >> $d/chunk_alone.txt 2>&1
    echo "rc $?" >> $d/chunk_alone.txt; pk
  done
done
grep -v INFO $d/chunk_alone.txt
QLABENCH_BWD_BV=32 run b_${use}_bv32 110 $use $R
QLABENCH_BWD_BV=64 run b_${use}_bv64 110 $use $R
for v in bv32 bv64; do python -m qlabench compare $d/b_$use.json $d/b_${use}_$v.json > $d/cmp_$v.txt 2>&1; done; pk
for v in bv32 bv64; do echo "== forced $v"; grep -E "geomean|FASTER|SLOWER" $d/cmp_$v.txt | head -20; done
echo "done at $(el) s"
