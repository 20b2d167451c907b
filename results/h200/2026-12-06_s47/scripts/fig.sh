#!/usr/bin/env bash
# Session 47, call 4: h200-bwd phase bwd, qla, at main (a6420be: the trees' main); on an H200 it is the issue's figure
# (report against results/h200/2026-11-29_f7c378e/h200-bwd-peers.json).
set -u
. .device/s47/common.sh
call_setup fig
cat $d/gpu.txt
run b_fig 200 main --sweep h200-bwd --phase bwd --backends qla
echo "done at $(el) s"
