#!/usr/bin/env bash
# Session 36, call 2: the checkout (main + bwd_dh_ws v5, htma left out: it was slower alone in call 1) against old,
# and combo = the checkout + wip/s35-chunk-early's bwd_chunk (3 files), then combo's backward GPU tests.
#   args: the checkout's commit. Output $OUT/n2.tar.
set -u
. .device/s35/common.sh
call_setup n2
mkdir -p $TR/cur && cp -r qlabench tests configs pyproject.toml $TR/cur/ && echo "cur $1" >> $TR/COMMITS
cp -r $TR/cur $TR/combo && echo "combo $1+early" >> $TR/COMMITS
for f in qlabench/kernels/hopper/bwd_chunk.py qlabench/kernels/hopper/bwd_chunk_steps.py tests/kernels/test_bwd_chunk_compile.py; do
  cp $TR/early/$f $TR/combo/$f
done
R="--sweep h200-bwd --phase bwd --backends qla"
run b_old 110 old $R
run b_cur 110 cur $R
run b_combo 110 combo $R
for t in cur combo; do python -m qlabench compare $d/b_old.json $d/b_$t.json > $d/cmp_$t.txt 2>&1; done
python -m qlabench compare $d/b_cur.json $d/b_combo.json > $d/cmp_combo_cur.txt 2>&1; pk
for t in cur combo combo_cur; do echo "== $t"; grep -E "FASTER|SLOWER|geomean|qla:" $d/cmp_$t.txt | head -24; done
grep -E "Over tolerance|non-finite|FAIL" $d/b_cur.log $d/b_combo.log | head -6
for f in tests/kernels/test_backward_gpu.py tests/kernels/test_backward_cp_gpu.py tests/kernels/test_bwd_chunk_compile.py; do
  (cd $TR/combo && timeout -s KILL 200 python -m pytest -q -m gpu -p no:cacheprovider $f > $d/t_combo_$(basename $f .py).log 2>&1
   echo "exit $?" >> $d/t_combo_$(basename $f .py).log) &
done
wait; pk
for f in $d/t_combo_*.log; do echo "$(basename $f): $(grep -E "passed|failed" $f | tail -1) $(tail -1 $f)"; grep -E "^FAILED|^E  .*rel" $f | head -6; done
echo "tests done at $(el) s"
[ $(el) -lt 380 ] && run sp_cur 60 cur --cfg hk16_hv16 --cfg hk16_hv32 --cfg hk16_hv64 --seqlens 1x32768 --phase bwd --backends qla --kernel-split
grep -A40 "PER-KERNEL" $d/sp_cur.log 2>/dev/null | grep -E "^bwd|kernel|sum|median" | head -30
echo "done at $(el) s"
