#!/usr/bin/env bash
# Session 49 (session 48's script): the issue's figure, only on an H200 (exits at once on any other card, so a try costs only the start).
# h200-bwd phases bwd and fwdbwd (argument "bwd": phase bwd only), qla, tree main (COMMITS: main at cbc6359, the kernels
# of 51363db). Report each against results/h200/2026-11-29_f7c378e/h200-bwd-peers.json.
set -u
. .device/s49/common.sh
call_setup fig2
cat $d/gpu.txt
if ! grep -q "H200" $d/gpu.txt; then echo "not an H200: nothing run"; pk; exit 0; fi
run b_fig 200 main --sweep h200-bwd --phase bwd --backends qla
[ "${1:-both}" = bwd ] || run fb_fig 250 main --sweep h200-bwd --phase fwdbwd --backends qla
echo "done at $(el) s"
