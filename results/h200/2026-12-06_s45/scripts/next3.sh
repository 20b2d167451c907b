#!/usr/bin/env bash
# Session 45, call 4: lpt (first this time) against cur, phase fwd on h200-fwd's short-first pairs and 32k_4/8seq
# (call 1 ran cur first), then phase fwdbwd on 32k_4seq / 32k_8seq, lpt then cur.
# device run: carry as next1b.sh, command "bash .device/gpu-env.sh bash .device/s45/next3.sh", timeout_s 240
set -u
. .device/s45/common.sh
call_setup n3
F="--cfg hk16_hv32,hk8_hv16,hk16_hv16,hk4_hv8,hk16_hv64 --backends qla --warmup 5 --repeats 60"
P1="--seqlens 4096+28672,8192+24576,2048+6144,1024+7168,32k_4seq,32k_8seq"
run f_lpt 60 lpt $F $P1 --phase fwd
run f_cur 60 cur $F $P1 --phase fwd
P2="--seqlens 32k_4seq,32k_8seq"
[ $(el) -lt 140 ] && run fb_lpt 45 lpt $F $P2 --phase fwdbwd && run fb_cur 45 cur $F $P2 --phase fwdbwd
pk
echo "done at $(el) s"
