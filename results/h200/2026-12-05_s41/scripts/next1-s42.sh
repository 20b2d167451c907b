#!/usr/bin/env bash
# Prepared in session 41 for the next GPU session: wip/s41-glue (916bfbc) against main (83e36ba = 25b8923's kernels).
# glue: cp_correct reads its start rows through init_rows and stages its chain tables in shared memory, sm90 issues a
# step's three products with one wait; the CP backward's piece rows double as the local pass's terminal gradients (no
# dht_loc fill / index_select / index_copy, no first-slot gather, no zeroed slot rows); dh0 of consecutive first pieces
# as a view; the CP forward skips its h0 gather and its first-row copy when every sequence is long.
# First cp_correct's own GPU test in the glue tree (the rows every CP row's chain depends on), then phase bwd (and
# fwdbwd if time is left), qla, on the CP rows of four presets, cur and glue. Land glue if the test and every row pass
# and the A/B is not slower; then the whole GPU suite at the landed commit and the h200-bwd sweep.
# Setup (CPU): trees = `git archive <commit> qlabench configs tests pyproject.toml` in .device/s41/trees/{cur,glue},
# commits in .device/s41/trees/COMMITS; results/ moved out of the checkout.
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s41"],
# command "bash .device/gpu-env.sh bash .device/s41/next1.sh", timeout_s 600
set -u
. .device/s41/common.sh
call_setup n1
(cd $TR/glue && timeout -s KILL 150 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_forward_cp_gpu.py \
   -k cp_correct > $d/t_cp_correct.log 2>&1; echo "exit $?" >> $d/t_cp_correct.log)
echo "cp_correct test: $(grep -E 'passed|failed|error' $d/t_cp_correct.log | tail -n 1) $(tail -n 1 $d/t_cp_correct.log) at $(el) s"
grep -hE "^FAILED|^ERROR" $d/t_cp_correct.log | head; pk
B="--cfg hk16_hv16,hk8_hv16,hk4_hv8,hk2_hv4 --seqlens 8k_1seq,8k_2seq,32k_1seq,32k_2seq --backends qla --warmup 5 --repeats 60"
run b_cur 130 cur $B --phase bwd
run b_glue 130 glue $B --phase bwd
python -m qlabench compare $d/b_cur.json $d/b_glue.json > $d/cmp_glue.txt 2>&1
grep -E "FASTER|SLOWER|geomean|qla:|verdicts" $d/cmp_glue.txt | head -24
[ $(el) -lt 420 ] && run f_cur 80 cur $B --phase fwdbwd && run f_glue 80 glue $B --phase fwdbwd && \
  python -m qlabench compare $d/f_cur.json $d/f_glue.json > $d/cmp_glue_f.txt 2>&1 && \
  grep -E "geomean|qla:|verdicts" $d/cmp_glue_f.txt | head
[ $(el) -lt 530 ] && run s_glue 45 glue --cfg hk2_hv4,hk16_hv16 --seqlens 8k_1seq --phase bwd --backends qla --kernel-split
pk
echo "done at $(el) s"
