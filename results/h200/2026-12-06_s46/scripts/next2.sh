#!/usr/bin/env bash
# Session 46, call 2: h200-bwd phase bwd at cur with --kernel-split (every row's per-kernel device time), to find the
# glue (fills, casts, copies, table builds) besides the four chunk kernels on the small rows.
set -u
. .device/s46/common.sh
call_setup n2
cat $d/gpu.txt
run ks 420 cur --sweep h200-bwd --phase bwd --backends qla --kernel-split
pk
echo "done at $(el) s"
