# Sourced by the call scripts beside it: setup and the sweep runner (session 44's common.sh, folder-independent).
#   call_setup NAME: unpack the kernel cache if absent; TILELANG_CACHE_DIR, TR (the trees), S (this folder), d (the
#   call's files: pk packs them into $OUT/NAME.tar; el gives the seconds since the start).
#   run NAME LIMIT TREE ARGS...: `qlabench run ARGS` from TREE (qrun.py: the tree's code really runs), with the tree's
#   commit, killed after LIMIT s, into $d/NAME.json and .log; then pk.
call_setup() {
  t0=$(date +%s)
  [ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
  export TILELANG_CACHE_DIR=$PWD/.device/tlcache
  call=$1
  d=/tmp/${call}_$t0; mkdir -p $d
  S=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)  # the folder of this file
  TR=$S/trees
  cp $TR/COMMITS $d/
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > $d/gpu.txt 2>&1
}
el() { echo $(( $(date +%s) - t0 )); }
pk() { tar -C $d -cf $OUT/$call.tar .; }
run() {
  local name=$1 lim=$2 tree=$3; shift 3
  QLABENCH_CONFIG_DIR=$PWD/configs PYTHONPATH=$TR/$tree:$PYTHONPATH QLABENCH_GIT_COMMIT=$(awk -v t=$tree '$1 == t {print $2}' $TR/COMMITS) \
    timeout -s KILL $lim python $S/qrun.py run --arch sm90 --no-progress --out $d/$name.json "$@" > $d/$name.log 2>&1
  echo "$name rc $? at $(el) s ($(head -1 $d/$name.log))"; pk
}
