#!/usr/bin/env bash
# Session 38, call 4 (budget for sweeps only): h200-bwd phase bwd qla, cur, gtail, per2tail; compare. Trees as call2.sh.
# device run: carry as call3.sh, command "bash .device/gpu-env.sh bash .device/s38/call4.sh", timeout_s 300
set -u
. .device/s35/common.sh
call_setup c4
[ -d .device/s38/trees/cur ] || tar -xJf .device/s38/trees.tar.xz -C .device/s38/
TR=$PWD/.device/s38/trees
cp $TR/COMMITS $d/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $d/gpu.txt 2>&1
R="--sweep h200-bwd --phase bwd --backends qla"
for t in cur gtail per2tail; do run b_$t 100 $t $R; done
for t in gtail per2tail; do
  python -m qlabench compare $d/b_cur.json $d/b_$t.json > $d/cmp_$t.txt 2>&1
  echo "== $t"; grep -E "FASTER|SLOWER|geomean|qla:" $d/cmp_$t.txt | head -30
done
pk
echo "done at $(el) s"
