#!/usr/bin/env bash
# Session 39, call 1: compile (qlabench aot of the h200-bwd presets in the checkout = svov's tree, and bwd_chunk of
# the cur and gtail trees), then h200-bwd phase bwd, qla, for cur, gtail, svov; compare each to cur.
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s39"],
# command "bash .device/gpu-env.sh bash .device/s39/call1.sh", timeout_s 600
set -u
. .device/s39/common.sh
call_setup c1
for cfg in hk16_hv32 hk8_hv16 hk4_hv8 hk2_hv4 hk16_hv16; do
  python -m qlabench aot --arch sm90 --cfg $cfg --state-layout kv > $d/aot_$cfg.log 2>&1 &
done
SH="16,32,bfloat16 16,16,bfloat16 8,16,bfloat16 4,8,bfloat16 2,4,bfloat16"
for t in cur gtail; do
  PYTHONPATH=$TR/$t:$PYTHONPATH python $S/compile_chunk.py 3 $SH > $d/chunk_$t.log 2>&1 &
done
wait
echo "compiled at $(el) s"; tail -n 2 $d/aot_*.log; pk
R="--sweep h200-bwd --phase bwd --backends qla"
run b_cur 120 cur $R
run b_gtail 100 gtail $R
run b_svov 100 svov $R
for t in gtail svov; do
  python -m qlabench compare $d/b_cur.json $d/b_$t.json > $d/cmp_$t.txt 2>&1
  echo "== cur -> $t"; grep -E "FASTER|SLOWER|geomean|qla:" $d/cmp_$t.txt | head -24
done
pk
echo "done at $(el) s"
