#!/usr/bin/env bash
# Session 48: the backward figure only (h200-bwd phase bwd, qla, tree main = de4ca59, the kernels of 51363db),
# run only on an H200 (any other card: nothing run). Report against results/h200/2026-11-29_f7c378e/h200-bwd-peers.json.
set -u
. .device/s48/common.sh
call_setup figb
cat $d/gpu.txt
if ! grep -q "H200" $d/gpu.txt; then echo "not an H200: nothing run"; pk; exit 0; fi
run b_fig 200 main --sweep h200-bwd --phase bwd --backends qla
echo "done at $(el) s"
