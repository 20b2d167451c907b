#!/usr/bin/env bash
# Session 30 call 2: bwd_fused with the next chunk's tiles prefetched into L2 (QLABENCH_T_L2PF, wip/s30):
# clock64 phase timing at 1x32768 hk16_hv16, then h200-bwd hk16_hv16 bwd with bwd_fused forced, L2PF 0 / 1.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
d=$OUT/c2; mkdir -p $d
run() { local name=$1; shift; env "$@" timeout 90 python .device/s30/timing.py 32768 > $d/$name.txt 2>&1; echo "$name rc $? at $(el) s"; }
run base X=0
run l2pf QLABENCH_T_L2PF=1
run l2pf_tma QLABENCH_T_L2PF=1 QLABENCH_T_TMA_STORE=1
for pf in 0 1; do
  QLABENCH_T_L2PF=$pf QLABENCH_GIT_COMMIT=$(cat .device/s30/HEAD)+wip-l2pf$pf timeout 150 python -m qlabench run --arch sm90 \
    --no-progress --out $d/ab_l2pf$pf.json --sweep h200-bwd --cfg hk16_hv16 --phase bwd \
    --backends qla:cp=on+bwd_dh=fused > $d/ab_l2pf$pf.log 2>&1; echo "ab $pf rc $? at $(el) s"
done
python -m qlabench compare $d/ab_l2pf0.json $d/ab_l2pf1.json > $d/compare.txt 2>&1
for f in base l2pf l2pf_tma; do echo "$f: $(grep 'backward ms' $d/$f.txt) $(grep '^total' $d/$f.txt)"; done
tail -20 $d/compare.txt
