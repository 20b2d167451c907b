#!/usr/bin/env bash
# Session 28, call 3: bwd_dh=fused with the training forward's fused plan (cp.fused_piece_chunks): its GPU test, then
# h200-bwd hk16_hv16 default vs fused, phases bwd and fwdbwd, and the split at 32k_2seq / 32k_4seq patterns.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar -xJf .device/tlcache.tar.xz -C .device/ && echo "cache unpacked at $(el) s"
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
export QLABENCH_GIT_COMMIT=$(cat .device/s28/HEAD)
d=/tmp/f2_$t0; mkdir -p $d
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_bwd_fused_gpu.py > $d/test.log 2>&1
rc=$?; echo "test rc $rc at $(el) s"; tail -5 $d/test.log; tar -C $d -cf $OUT/f2.tar .
[ $rc = 0 ] || exit 1
for ph in bwd fwdbwd; do
timeout 150 python -m qlabench run --arch sm90 --sweep h200-bwd --cfg hk16_hv16 --phase $ph \
  --backends qla,qla:bwd_dh=fused --no-progress --out $d/ab_$ph.json > $d/ab_$ph.log 2>&1
echo "ab $ph rc $? at $(el) s"; tar -C $d -cf $OUT/f2.tar .
done
timeout 100 python -m qlabench run --arch sm90 --cfg hk16_hv16 --seqlens 7212+25556 --seqlens 7212+7072+13725+4759 --phase bwd \
  --backends qla,qla:bwd_dh=fused --kernel-split --no-progress --out $d/split.json > $d/split.log 2>&1
echo "split rc $? at $(el) s"; tar -C $d -cf $OUT/f2.tar .
for ph in bwd fwdbwd; do grep -A12 "BENCHMARKS" $d/ab_$ph.log; grep -A12 "PEAK MEMORY" $d/ab_$ph.log | tail -10; done
