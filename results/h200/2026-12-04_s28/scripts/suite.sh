#!/usr/bin/env bash
# Session 28: the whole GPU suite at the final kernel commit (.device/s28/HEAD); summary + full logs in one tar.
set -u
tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
d=/tmp/suite_$(date +%s); mkdir -p $d
bash .device/gpu-tests > $d/gpu-tests-summary.txt 2>&1; echo "suite rc $?"
mv $OUT/gpu-tests.log $d/ 2>/dev/null; cat .device/s28/HEAD > $d/HEAD
tar -C $d -cf $OUT/suite.tar .
grep -E "^tests/|^FAILED|^ERROR" $d/gpu-tests-summary.txt
