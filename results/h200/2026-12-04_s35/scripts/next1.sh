#!/usr/bin/env bash
# Prepared in session 35 (replaces session 34's next1.sh) for the next GPU session's first call. Every variant
# runs from a tree (.device/s35/trees, commits in trees/COMMITS), so any checkout works.
#   both   = wip/s34-both:  bwd_dh_ws v5 (dh / dV' row stores by TMA from the producer) + bwd_h_ws htma
#   ntboth = wip/s35-ntboth: bwd_dh_ws nt (v5 with the row stores back on the aux WG, no TMA store) + htma
#   dh, nt = the same bwd_dh_ws alone (main's bwd_h_ws); old = main; probe = v5 with clock64 phase sums
# A. kernels alone: bwd_dh old / both / ntboth, bwd_h old / htma, the v5 probe (hard kill 45 s per process;
#    after one killed v5 run the other v5 runs are skipped).
# B. bwd_dh_ws's own GPU test (structure + A/B against bwd_dh_pipelined and the twin) from both and ntboth, in
#    parallel (~30 s).
# C. pick: the faster alone (sum over the three configs) of the candidates whose test passed and that beat old at
#    (16, 64, 64) and (16, 16, 32); with none, htma alone (tree htma) if it beat old there; else stop.
# D. the backward and CP-backward GPU tests from the pick's tree; if they fail, once more from its bwd_dh-only tree
#    (dh or nt: is htma the culprit?). The dg stress test belongs to the final suite.
# E. if time is left: h200-bwd phase bwd (qla) old / pick through qrun.py (next2.sh otherwise).
# Output: $OUT/n1.tar (packed after every step); the pick in pick.txt.
#   device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz",
#   ".device/s35", ".device/gpu-tests"] (results/ moved out of the tree first), command
#   "bash .device/gpu-env.sh bash .device/s35/next1.sh", timeout_s 600
set -u
. .device/s35/common.sh
call_setup n1
cp $TR/COMMITS $d/
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $d/gpu.txt 2>&1
# A
hung=""
for c in "16 64 64" "16 32 64" "16 16 32"; do
  for t in old both ntboth; do
    case " $hung " in *" $t "*) echo "== $t $c skipped (an earlier run was killed)" >> $d/alone.txt; continue;; esac
    echo "== $t $c" >> $d/alone.txt
    PYTHONPATH=$TR/$t:$PYTHONPATH timeout -s KILL 45 python $S/dh_alone.py $c >> $d/alone.txt 2>&1
    rc=$?; echo "rc $rc" >> $d/alone.txt; [ $rc = 137 ] && hung="$hung $t"; pk
  done
done
for c in "16 64 64" "16 32 64" "16 16 32"; do
  for t in old both; do
    echo "== $t $c" >> $d/h_alone.txt
    PYTHONPATH=$TR/$t:$PYTHONPATH timeout -s KILL 45 python $S/h_alone.py $c >> $d/h_alone.txt 2>&1
    echo "rc $?" >> $d/h_alone.txt; pk
  done
done
case " $hung " in *" both "*) ;; *)
  for c in "16 64 64" "16 16 32"; do
    echo "== probe $c" >> $d/probe.txt
    PYTHONPATH=$TR/probe:$PYTHONPATH timeout -s KILL 45 python $S/dh_alone.py $c >> $d/probe.txt 2>&1
    echo "rc $?" >> $d/probe.txt; pk
  done;;
esac
echo "alone at $(el) s (killed: ${hung:-none})"; grep -v INFO $d/alone.txt $d/h_alone.txt | grep -v ":  "
grep -v INFO $d/probe.txt 2>/dev/null
# B
for t in both ntboth; do
  (cd $TR/$t && timeout -s KILL 120 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_bwd_dh_ws_compile.py \
     > $d/t_dhws_$t.log 2>&1; echo "exit $?" >> $d/t_dhws_$t.log) &
done
wait; pk
for t in both ntboth; do echo "dh_ws test $t: $(grep -E "passed|failed" $d/t_dhws_$t.log | tail -1) $(tail -1 $d/t_dhws_$t.log)"; done
# C
pick=$(python - "$d" <<'PY'
import re, sys
d = sys.argv[1]
step = {}
for block in open(f"{d}/alone.txt").read().split("== ")[1:]:
    name, *rest = block.split("\n")
    m = re.search(r"has_skip 0: [0-9.]+ us, ([0-9.]+) us per", block)
    if m:
        step[tuple(name.split())] = float(m.group(1))
cfgs = [("16", "64", "64"), ("16", "32", "64"), ("16", "16", "32")]
ok = []
for t in ("both", "ntboth"):
    log = open(f"{d}/t_dhws_{t}.log").read()
    passed = log.rstrip().endswith("exit 0") and " passed" in log
    faster = all(step.get((t, *c), 1e9) < step.get(("old", *c), 0) for c in (cfgs[0], cfgs[2]))
    if passed and faster and all((t, *c) in step for c in cfgs):
        ok.append((sum(step[(t, *c)] for c in cfgs), t))
print(min(ok)[1] if ok else "none")
PY
)
if [ "$pick" = none ]; then  # no bwd_dh_ws variant: htma alone, if it is faster alone (tree htma = main + htma)
  pick=$(python - "$d" <<'PY'
import re, sys
step = {}
for block in open(f"{sys.argv[1]}/h_alone.txt").read().split("== ")[1:]:
    m = re.search(r"us, ([0-9.]+) us per chunk step", block)
    if m:
        step[tuple(block.split("\n")[0].split())] = float(m.group(1))
cfgs = [("16", "64", "64"), ("16", "16", "32")]
print("htma" if all(step.get(("both", *c), 1e9) < step.get(("old", *c), 0) for c in cfgs) else "none")
PY
)
fi
echo "$pick" > $d/pick.txt; pk
echo "pick: $pick ($(el) s)"
[ "$pick" = none ] && exit 0
# D
declare -A solo=([both]=dh [ntboth]=nt [htma]=none)
tests_ok() {  # tree -> the backward / CP-backward GPU tests; 0 if both files pass
  local t=$1
  for f in tests/kernels/test_backward_gpu.py tests/kernels/test_backward_cp_gpu.py; do
    (cd $TR/$t && timeout -s KILL 200 python -m pytest -q -m gpu -p no:cacheprovider $f > $d/t_${t}_$(basename $f .py).log 2>&1
     echo "exit $?" >> $d/t_${t}_$(basename $f .py).log) &
  done
  wait; pk
  local bad=0
  for f in $d/t_${t}_*.log; do
    echo "$(basename $f): $(grep -E "passed|failed" $f | tail -1) $(tail -1 $f)"; grep -E "^FAILED|^E  .*rel" $f | head -6
    tail -1 $f | grep -q "exit 0" || bad=1
  done
  return $bad
}
if tests_ok $pick; then
  use=$pick
elif [ ${solo[$pick]} != none ] && [ $(el) -lt 330 ] && tests_ok ${solo[$pick]}; then
  use=${solo[$pick]}
else
  echo "tests failed at $(el) s"; echo "failed" >> $d/pick.txt; pk; exit 0
fi
echo "use $use" >> $d/pick.txt; pk
echo "tests pass for $use at $(el) s"
# E
[ $(el) -lt 360 ] || { echo "no time for the API A/B: next2.sh $use"; exit 0; }
R="--sweep h200-bwd --phase bwd --backends qla"
run b_old 110 old $R
run b_$use 110 $use $R
python -m qlabench compare $d/b_old.json $d/b_$use.json > $d/cmp_$use.txt 2>&1; pk
echo "== $use vs old"; grep -E "FASTER|SLOWER|geomean" $d/cmp_$use.txt | head -50
echo "done at $(el) s"
