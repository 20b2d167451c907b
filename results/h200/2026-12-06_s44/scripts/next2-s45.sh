#!/usr/bin/env bash
# Prepared in session 44. lpt's forward GPU test files (its kernels changed: they compile here), then the backward's
# V tile forced to 32 and to 64 (QLABENCH_BWD_BV) against auto over h200-bwd phase bwd in cur, for a refit of
# value_tile.BACKWARD_STEP_US (fitted before bwd_dh_ws v5, session 36; the model's absolute times are now ~1.5x the
# measured ones).
# device run: carry as next1.sh, command "bash .device/gpu-env.sh bash .device/s45/next2.sh", timeout_s 600
set -u
. .device/s45/common.sh
call_setup n2
for f in test_forward_gpu test_forward_cp_gpu; do
  (cd $TR/lpt && timeout -s KILL 330 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/$f.py \
     > $d/t_$f.log 2>&1; echo "exit $?" >> $d/t_$f.log) &
done
wait
for f in test_forward_gpu test_forward_cp_gpu; do
  echo "lpt $f: $(grep -E 'passed|failed|error' $d/t_$f.log | tail -n 1) $(tail -n 1 $d/t_$f.log)"
  grep -hE "^FAILED|^ERROR" $d/t_$f.log | head -5
done
echo "tests done at $(el) s"; pk
for bv in 32 64; do
  [ $(el) -lt 450 ] || break
  export QLABENCH_BWD_BV=$bv
  run hb_bv$bv 120 cur --sweep h200-bwd --phase bwd --backends qla --warmup 5 --repeats 60
  unset QLABENCH_BWD_BV
done
pk
echo "done at $(el) s"
