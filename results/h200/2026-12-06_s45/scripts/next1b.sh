#!/usr/bin/env bash
# Session 45, call 1: h200-bwd phase bwd, qla at cur (main), the backward's V tile by the model (auto), forced to 32,
# forced to 64, then auto again (the run-to-run spread on one machine), same warmup/repeats as session 44's figure.
# Then, if time is left, forward cur against lpt.
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s45"],
# command "bash .device/gpu-env.sh bash .device/s45/next1b.sh", timeout_s 600 (results/ moved out first)
set -u
. .device/s45/common.sh
call_setup n1
run hb 150 cur --sweep h200-bwd --phase bwd --backends qla
export QLABENCH_BWD_BV=32; run hb_bv32 130 cur --sweep h200-bwd --phase bwd --backends qla
export QLABENCH_BWD_BV=64; run hb_bv64 130 cur --sweep h200-bwd --phase bwd --backends qla
unset QLABENCH_BWD_BV
run hb2 130 cur --sweep h200-bwd --phase bwd --backends qla
F="--cfg hk16_hv32,hk8_hv16,hk16_hv16,hk4_hv8,hk16_hv64 --backends qla --warmup 5 --repeats 60"
P1="--seqlens 4096+28672,8192+24576,2048+6144,1024+7168,32k_4seq,32k_8seq"
[ $(el) -lt 430 ] && run f_cur 70 cur $F $P1 --phase fwd && run f_lpt 70 lpt $F $P1 --phase fwd
pk
echo "done at $(el) s"
