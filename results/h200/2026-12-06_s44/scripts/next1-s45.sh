#!/usr/bin/env bash
# Prepared in session 44 for the next GPU session. Trees (`git archive <commit> qlabench configs tests pyproject.toml`
# in .device/s45/trees/{cur,lpt}, commits in trees/COMMITS): cur = main (kernels = 7641d9d's), lpt = wip/s44-fwd-lpt
# (the forward's chunk recurrences dispatch the sequences longest chain first, as the backward's do).
# 1. h200-bwd phase bwd, qla, cur: the 40-row figure again (session 44's H200: 2.9966x FLA, 0.1% under 3x).
# 2. phase fwd, qla, cur against lpt on the rows where the order or the sorted V-tile model can change something
#    (h200-fwd's short-first pairs, 32k_4seq / 32k_8seq), five presets whose cur kernels are in the cache.
# 3. phase fwdbwd, cur against lpt, on 32k_4seq / 32k_8seq / 8k_8seq (time left).
# .device/tlcache.tar.xz holds cur's kernels (fresh aot, session 43) plus lpt's forward kernels for those presets.
# device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz", ".device/s45"],
# command "bash .device/gpu-env.sh bash .device/s45/next1.sh", timeout_s 600 (results/ moved out first)
set -u
. .device/s45/common.sh
call_setup n1
run hb 160 cur --sweep h200-bwd --phase bwd --backends qla
F="--cfg hk16_hv32,hk8_hv16,hk16_hv16,hk4_hv8,hk16_hv64 --backends qla --warmup 5 --repeats 60"
P1="--seqlens 4096+28672,8192+24576,2048+6144,1024+7168,32k_4seq,32k_8seq"
run f_cur 100 cur $F $P1 --phase fwd
run f_lpt 120 lpt $F $P1 --phase fwd
python -m qlabench compare $d/f_cur.json $d/f_lpt.json > $d/cmp_fwd.txt 2>&1
echo "== fwd lpt / cur"; grep -E "FASTER|SLOWER|geomean|qla:|verdicts" $d/cmp_fwd.txt | head -40
P2="--seqlens 8k_8seq,32k_4seq,32k_8seq"
[ $(el) -lt 400 ] && run fb_cur 80 cur $F $P2 --phase fwdbwd && run fb_lpt 80 lpt $F $P2 --phase fwdbwd && \
  python -m qlabench compare $d/fb_cur.json $d/fb_lpt.json > $d/cmp_fwdbwd.txt 2>&1 && \
  echo "== fwdbwd lpt / cur" && grep -E "FASTER|SLOWER|geomean|qla:|verdicts" $d/cmp_fwdbwd.txt | head -20
pk
echo "done at $(el) s"
