#!/usr/bin/env bash
# Prepared in session 40 for the next GPU session: wip/s40-rows (2ddeb49; cp_correct writes the CP chain into
# per-piece rows, so neither the CP forward nor the CP backward gathers the piece states / end gradients) against main.
# First the GPU test files of the changed paths, in the rows tree, in parallel; then phase bwd and fwdbwd, qla, on the
# CP rows of h200-bwd for cur and rows.
# Setup (CPU): trees = `git archive <commit> qlabench configs tests pyproject.toml` into .device/s40/trees/{cur,rows},
# their commits in .device/s40/trees/COMMITS ("cur <sha>", "rows <sha>"); results/ moved out of the checkout.
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s40"],
# command "bash .device/gpu-env.sh bash .device/s40/next1.sh", timeout_s 600
set -u
. .device/s40/common.sh
call_setup n1
for f in test_forward_cp_gpu test_backward_cp_gpu test_bwd_fused_gpu; do
  (cd $TR/rows && timeout -s KILL 300 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/$f.py \
     > $d/t_$f.log 2>&1; echo "exit $?" >> $d/t_$f.log) &
done
wait
for f in $d/t_*.log; do echo "$(basename $f): $(grep -E 'passed|failed|error' $f | tail -n 1) $(tail -n 1 $f)"; done
grep -hE "^FAILED|^ERROR" $d/t_*.log | head -20; pk
B="--cfg hk16_hv16,hk8_hv16,hk4_hv8,hk2_hv4 --seqlens 8k_1seq,8k_2seq,32k_1seq,32k_2seq --backends qla --warmup 5 --repeats 60"
run b_cur 110 cur $B --phase bwd
run b_rows 90 rows $B --phase bwd
python -m qlabench compare $d/b_cur.json $d/b_rows.json > $d/cmp_rows.txt 2>&1
grep -E "FASTER|SLOWER|geomean|qla:|verdicts" $d/cmp_rows.txt | head -24
[ $(el) -lt 440 ] && run f_cur 70 cur $B --phase fwdbwd && run f_rows 70 rows $B --phase fwdbwd && \
  python -m qlabench compare $d/f_cur.json $d/f_rows.json > $d/cmp_rows_f.txt 2>&1 && \
  grep -E "geomean|qla:|verdicts" $d/cmp_rows_f.txt | head
pk
echo "done at $(el) s"
