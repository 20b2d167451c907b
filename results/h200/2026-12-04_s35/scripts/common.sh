# Sourced by next1.sh and next2.sh (session 35): the call's setup and the sweep runner, one copy for both.
#   call_setup NAME: unpack the kernel cache and the variant trees if absent; set TILELANG_CACHE_DIR, TR (the trees),
#   S (this folder) and d (/tmp/NAME_<start>, the call's files: pk packs them into $OUT/NAME.tar; el gives the
#   seconds since the start).
#   run NAME LIMIT TREE ARGS...: `qlabench run ARGS` from TREE (through qrun.py, so the tree's code really runs) with
#   the tree's commit and the checkout's configs (QLABENCH_CONFIG_DIR), killed after LIMIT s, into $d/NAME.json and
#   .log; then pk.
call_setup() {
  t0=$(date +%s)
  [ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
  export TILELANG_CACHE_DIR=$PWD/.device/tlcache
  call=$1
  d=/tmp/${call}_$t0; mkdir -p $d
  [ -d .device/s35/trees/old ] || tar -xJf .device/s35/trees.tar.xz -C .device/s35/
  TR=$PWD/.device/s35/trees
  S=$PWD/.device/s35
}
el() { echo $(( $(date +%s) - t0 )); }
pk() { tar -C $d -cf $OUT/$call.tar .; }
run() {
  local name=$1 lim=$2 tree=$3; shift 3
  QLABENCH_CONFIG_DIR=$PWD/configs PYTHONPATH=$TR/$tree:$PYTHONPATH QLABENCH_GIT_COMMIT=$(awk -v t=$tree '$1 == t {print $2}' $TR/COMMITS) \
    timeout -s KILL $lim python $S/qrun.py run --arch sm90 --no-progress --out $d/$name.json "$@" > $d/$name.log 2>&1
  echo "$name rc $? at $(el) s ($(head -1 $d/$name.log))"; pk
}
