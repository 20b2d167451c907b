#!/usr/bin/env bash
# Session 28, call 6: the GPU test files that exercise bwd_chunk and bwd_fused, after their shared steps moved to
# hopper/bwd_chunk_steps.py (same generated CUDA; kernels precompiled into .device/tlcache), in parallel.
set -u
tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
d=/tmp/verify_$(date +%s); mkdir -p $d; cat .device/s28/HEAD > $d/HEAD
for f in tests/kernels/test_bwd_fused_gpu.py tests/kernels/test_backward_gpu.py tests/kernels/test_backward_cp_gpu.py; do
  (timeout 400 python -m pytest -q -m gpu -p no:cacheprovider $f > $d/$(basename $f .py).log 2>&1; echo "exit $?" >> $d/$(basename $f .py).log) &
done
wait
for l in $d/*.log; do echo "$(basename $l): $(tail -2 $l | tr '\n' ' ')"; grep -E "^FAILED|^ERROR" $l | head -5; done
tar -C $d -cf $OUT/verify.tar .
