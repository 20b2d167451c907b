#!/usr/bin/env bash
# Session 33 call 3: bwd_dh_ws v3 (Zn = -Ag diag(e) K formed by the aux warpgroup in its own chunk, after Pg^T dO; chain
# K dS -> dV' -> Zn^T dV'): alone old/new, the backward's GPU tests, h200-bwd phase bwd (qla) new / old through
# qrun.py (the tree on PYTHONPATH really runs), the split at 1x32768.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
head=$(cat .device/s33/HEAD)
d=/tmp/c3_$t0; mkdir -p $d
pk() { tar -C $d -cf $OUT/c3.tar .; }
TR=$PWD/.device/s33/trees
for c in "16 64 64" "16 32 64" "16 16 32" "16 64 32"; do
  for t in new old; do
    pp=$PWD; [ $t = new ] || pp=$TR/$t
    echo "== $t $c" >> $d/alone.txt
    PYTHONPATH=$pp:$PYTHONPATH timeout 60 python .device/s33/dh_alone.py $c >> $d/alone.txt 2>&1
  done
done
echo "alone at $(el) s"; pk; grep -v INFO $d/alone.txt
python - $d/alone.txt <<'PY' || { echo "new not faster alone: no API runs"; exit 0; }
import re, sys
t = {}
cur = None
for ln in open(sys.argv[1]):
    m = re.match(r"== (\w+) (.*)", ln)
    if m:
        cur = (m.group(1), m.group(2).strip())
    m = re.search(r"has_skip 0: ([\d.]+) us", ln)
    if m and cur:
        t[cur] = float(m.group(1))
gain = [t[("new", c)] / t[("old", c)] for c in ("16 64 64", "16 32 64") if ("new", c) in t and ("old", c) in t]
print("new / old alone:", gain)
sys.exit(0 if gain and max(gain) < 0.97 else 1)
PY
run() {  # name timeout pythonpath commit-suffix args...
  local name=$1 lim=$2 pp=$3 sfx=$4; shift 4
  QLABENCH_CONFIG_DIR=$PWD/configs PYTHONPATH=$pp:$PYTHONPATH QLABENCH_GIT_COMMIT=$head$sfx timeout $lim python .device/s33/qrun.py run --arch sm90 --no-progress --out $d/$name.json "$@" > $d/$name.log 2>&1
  echo "$name rc $? at $(el) s ($(head -1 $d/$name.log))"; pk
}
R="--sweep h200-bwd --phase bwd --backends qla"
run b_new 120 $PWD "" $R
run b_old 120 $TR/old "+olddh" $R
run sp_new 90 $PWD "" --cfg hk16_hv32 --cfg hk16_hv64 --seqlens 1x32768 --phase bwd --backends qla --kernel-split
python -m qlabench compare $d/b_old.json $d/b_new.json > $d/cmp.txt 2>&1; pk
cat $d/cmp.txt | tail -48
grep -B3 -A24 "PER-KERNEL" $d/sp_new.log | head -40
echo "done at $(el) s"
