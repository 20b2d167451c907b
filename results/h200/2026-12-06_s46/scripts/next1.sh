#!/usr/bin/env bash
# Prepared in session 45 for the next GPU session. Trees in .device/s46/trees (COMMITS): cur = main at 687db98 (its
# kernels are 2d57ba3's: the forward's recurrences longest first), tie = wip/s45-fwd-order-ties (33d1b64: token order
# where the makespan model says longest first cannot end sooner; host only, same kernels).
# On an H200: 1. h200-bwd phase bwd at cur, the 3x figure (report it against the stored H200 peers).
# On either card: 2. phase fwd, cur against tie and tie against cur, on h200-fwd's pairs and 32k_4seq / 32k_8seq
# (five presets whose forward kernels are in the cache): does the ~1% the pairs lost to longest first come back?
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s46"],
# command "bash .device/gpu-env.sh bash .device/s46/next1.sh", timeout_s 600 (results/ moved out first)
set -u
. .device/s46/common.sh
call_setup n1
cat $d/gpu.txt
if grep -q H200 $d/gpu.txt; then
  run hb 150 cur --sweep h200-bwd --phase bwd --backends qla
fi
F="--cfg hk16_hv32,hk8_hv16,hk16_hv16,hk4_hv8,hk16_hv64 --backends qla --warmup 5 --repeats 60"
P="--seqlens 4096+28672,8192+24576,2048+6144,1024+7168,32k_4seq,32k_8seq"
run f_cur 70 cur $F $P --phase fwd
run f_tie 70 tie $F $P --phase fwd
run f_tie2 70 tie $F $P --phase fwd
run f_cur2 70 cur $F $P --phase fwd
for a in "" 2; do python -m qlabench compare $d/f_cur$a.json $d/f_tie$a.json > $d/cmp_fwd$a.txt 2>&1; done
echo "== fwd tie / cur"; grep -hE "FASTER|SLOWER|verdicts|qla:" $d/cmp_fwd.txt $d/cmp_fwd2.txt | head -80
pk
echo "done at $(el) s"
