#!/usr/bin/env bash
# Session 39, call 2: in the checkout (the commit to land, its commit in $1): the whole GPU suite (.device/gpu-tests;
# its summary and logs under $OUT/suite), then, if time is left, h200-bwd phase fwdbwd, qla.
# device run: carry as call1.sh, command "bash .device/gpu-env.sh bash .device/s39/call2.sh <commit>", timeout_s 600
set -u
. .device/s39/common.sh
call_setup c2
echo "land $1" > $d/COMMITS
mkdir -p $OUT/suite
OUT=$OUT/suite timeout -s KILL 540 bash .device/gpu-tests > $OUT/suite/gpu-tests-summary.txt 2>&1
echo "exit $? at $(el) s" >> $OUT/suite/gpu-tests-summary.txt
cat $OUT/suite/gpu-tests-summary.txt
if [ $(el) -lt 440 ]; then
  QLABENCH_GIT_COMMIT=$1 timeout -s KILL $(( 585 - $(el) )) python -m qlabench run --arch sm90 --no-progress \
    --out $d/f_land.json --sweep h200-bwd --phase fwdbwd --backends qla > $d/f_land.log 2>&1
  echo "f_land rc $? at $(el) s"
fi
pk
echo "done at $(el) s"
