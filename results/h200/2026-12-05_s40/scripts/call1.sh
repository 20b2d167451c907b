#!/usr/bin/env bash
# Session 40, call 1: bwd_fused with GQA (tree gf = wip/s40-gqa-fused 518c3a4) against main's kernels (cur): h200-bwd's
# three GQA presets of at most 16 v-heads, phase bwd, qla: cur, gf (bwd_fused on the GQA rows that already run CP),
# gf with QLABENCH_T_GQA_RULE=1 (also cp_rule's wider fused entry for them); then gf's GQA GPU tests of bwd_fused.
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s40"],
# command "bash .device/gpu-env.sh bash .device/s40/call1.sh", timeout_s 600
set -u
. .device/s40/common.sh
call_setup c1
R="--cfg hk8_hv16,hk4_hv8,hk2_hv4 --seqlens bwd --phase bwd --backends qla"
run b_cur 110 cur $R
run b_gf 100 gf $R
export QLABENCH_T_GQA_RULE=1
run b_gfr 100 gf $R
unset QLABENCH_T_GQA_RULE
for t in gf gfr; do
  python -m qlabench compare $d/b_cur.json $d/b_$t.json > $d/cmp_$t.txt 2>&1
  echo "== cur -> $t"; grep -E "FASTER|SLOWER|geomean|qla:" $d/cmp_$t.txt | head -30
done
pk
(cd $TR/gf && timeout -s KILL $(( 560 - $(el) )) python -m pytest -q -m gpu -p no:cacheprovider -k gqa \
  tests/kernels/test_bwd_fused_gpu.py) > $d/t_fused.log 2>&1
echo "tests rc $? at $(el) s: $(tail -n 1 $d/t_fused.log)"; grep -E "^FAILED|Error" $d/t_fused.log | head
pk
echo "done at $(el) s"
