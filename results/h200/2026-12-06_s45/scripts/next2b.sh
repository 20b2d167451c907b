#!/usr/bin/env bash
# Session 45, call 2: lpt's forward GPU test files (its forward kernels changed).
# device run: carry as next1b.sh, command "bash .device/gpu-env.sh bash .device/s45/next2b.sh", timeout_s 600
set -u
. .device/s45/common.sh
call_setup n2
for f in test_forward_gpu test_forward_cp_gpu; do
  (cd $TR/lpt && timeout -s KILL 500 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/$f.py \
     > $d/t_$f.log 2>&1; echo "exit $?" >> $d/t_$f.log) &
done
wait
for f in test_forward_gpu test_forward_cp_gpu; do
  echo "lpt $f: $(grep -E 'passed|failed|error' $d/t_$f.log | tail -n 1) $(tail -n 1 $d/t_$f.log)"
  grep -hE "^FAILED|^ERROR" $d/t_$f.log | head -5
done
pk
echo "done at $(el) s"
