#!/usr/bin/env bash
# Prepared in session 41 for the next GPU session: wip/s41-glue (7a1c254) and wip/s41-cp2wg (6ede4fa) against main
# (9cdbb0d = 25b8923's kernels).
# glue: cp_correct reads its start rows through init_rows and stages its chain tables in shared memory, sm90 issues a
# step's three products with one wait; the CP backward's piece rows double as the local pass's terminal gradients (no
# dht_loc fill / index_select / index_copy, no first-slot gather, no zeroed slot rows); dh0 of consecutive first pieces
# as a view; the CP forward skips its first-row copy when every sequence is long.
# wg2 = glue + cp_correct on two warpgroups (sm90; each 64 rows of a step's products).
# First cp_correct's own GPU test in the glue and wg2 trees, then phase bwd, qla, on the CP rows of four presets for
# cur, glue and wg2 (and fwdbwd for cur / best if time is left), and a split of glue. Land the best of glue / wg2 if its
# test and every row pass and it is not slower than cur; then the whole GPU suite at the landed commit and h200-bwd.
# Setup (CPU): trees = `git archive <commit> qlabench configs tests pyproject.toml` in .device/s41/trees/{cur,glue,wg2},
# commits in .device/s41/trees/COMMITS; results/ moved out of the checkout.
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s41"],
# command "bash .device/gpu-env.sh bash .device/s41/next1.sh", timeout_s 600
set -u
. .device/s41/common.sh
call_setup n1
for t in glue wg2; do
  (cd $TR/$t && timeout -s KILL 120 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_forward_cp_gpu.py \
     -k cp_correct > $d/t_cp_correct_$t.log 2>&1; echo "exit $?" >> $d/t_cp_correct_$t.log) &
done
wait
for t in glue wg2; do
  echo "cp_correct test $t: $(grep -E 'passed|failed|error' $d/t_cp_correct_$t.log | tail -n 1) $(tail -n 1 $d/t_cp_correct_$t.log)"
  grep -hE "^FAILED|^ERROR" $d/t_cp_correct_$t.log | head -5
done
echo "tests done at $(el) s"; pk
B="--cfg hk16_hv16,hk8_hv16,hk4_hv8,hk2_hv4 --seqlens 8k_1seq,8k_2seq,32k_1seq,32k_2seq --backends qla --warmup 5 --repeats 60"
run b_cur 130 cur $B --phase bwd
run b_glue 120 glue $B --phase bwd
run b_wg2 120 wg2 $B --phase bwd
for t in glue wg2; do
  python -m qlabench compare $d/b_cur.json $d/b_$t.json > $d/cmp_$t.txt 2>&1
  echo "== $t / cur"; grep -E "SLOWER|geomean|qla:|verdicts" $d/cmp_$t.txt | head -12
done
python -m qlabench compare $d/b_glue.json $d/b_wg2.json > $d/cmp_wg2_glue.txt 2>&1
echo "== wg2 / glue"; grep -E "geomean|qla:|verdicts" $d/cmp_wg2_glue.txt | head -4
[ $(el) -lt 380 ] && run f_cur 70 cur $B --phase fwdbwd && run f_wg2 70 wg2 $B --phase fwdbwd && \
  python -m qlabench compare $d/f_cur.json $d/f_wg2.json > $d/cmp_wg2_f.txt 2>&1 && \
  echo "== fwdbwd wg2 / cur" && grep -E "geomean|qla:|verdicts" $d/cmp_wg2_f.txt | head -4
[ $(el) -lt 520 ] && run s_wg2 45 wg2 --cfg hk2_hv4,hk16_hv16 --seqlens 8k_1seq --phase bwd --backends qla --kernel-split
pk
echo "done at $(el) s"
