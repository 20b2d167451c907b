#!/usr/bin/env bash
# Session 32 call 1 at 2171724 (CP backward memory frees): (a) fwdbwd peak memory of the three GQA rows; (b) bwd_h_ws
# alone: main, clock64 probes, h stored by the producer; (c) hstore / svchunk A/B through the API.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache
head=$(cat .device/s32/HEAD)
d=/tmp/c1_$t0; mkdir -p $d
pk() { tar -C $d -cf $OUT/c1.tar .; }
TR=$PWD/.device/s32/trees
run() {  # name timeout pythonpath env commit-suffix args...
  local name=$1 lim=$2 pp=$3 ev=$4 sfx=$5; shift 5
  env $ev PYTHONPATH=$pp:$PYTHONPATH QLABENCH_GIT_COMMIT=$head$sfx timeout $lim python -m qlabench run --arch sm90 --no-progress --out $d/$name.json "$@" > $d/$name.log 2>&1
  echo "$name rc $? at $(el) s"; pk
}
run mem1 90 $PWD X=1 "" --sweep h200-bwd --cfg hk2_hv4,hk4_hv8 --seqlens 32k_8seq --phase fwdbwd --backends qla
run mem2 60 $PWD X=1 "" --sweep h200-bwd --cfg hk8_hv16 --seqlens 8k_2seq --phase fwdbwd --backends qla
for c in "16 64 64" "16 64 32" "16 32 64" "16 16 32" "16 16 64"; do
  for t in main hprobe hstore; do
    pp=$PWD; ev=X=1; [ $t = main ] || pp=$TR/$t; [ $t = hstore ] && ev=QLABENCH_T_HSTORE=producer
    echo "== $t $c" >> $d/alone.txt
    env $ev PYTHONPATH=$pp:$PYTHONPATH timeout 60 python .device/s32/h_alone.py $c >> $d/alone.txt 2>&1
  done
done
echo "alone at $(el) s"; pk
PYTHONPATH=$TR/hprobe:$PYTHONPATH timeout 60 python .device/s32/timing_h.py 16 64 32768 > $d/probe_api_16_64.txt 2>&1
PYTHONPATH=$TR/hprobe:$PYTHONPATH timeout 60 python .device/s32/timing_h.py 16 32 32768 > $d/probe_api_16_32.txt 2>&1
echo "probe api at $(el) s"; pk
S="--cfg hk16_hv64 --seqlens 1x32768 --phase bwd --backends qla --kernel-split"
run sp_base 60 $PWD X=1 "" $S
run sp_hst 60 $TR/hstore QLABENCH_T_HSTORE=producer +hstore $S
run sp_frag 60 $TR/svchunk QLABENCH_T_SV_CHUNK=frag +svfrag $S
R="--sweep h200-bwd --cfg hk16_hv32 --seqlens 32k_1seq,32k_2seq,32k_4seq,32k_8seq --phase bwd --backends qla"
run r_base 90 $PWD X=1 "" $R
run r_hst 90 $TR/hstore QLABENCH_T_HSTORE=producer +hstore $R
run r_frag 90 $TR/svchunk QLABENCH_T_SV_CHUNK=frag +svfrag $R
run r_base2 90 $PWD X=1 "" $R
for v in r_hst r_frag r_base2; do python -m qlabench compare $d/r_base.json $d/$v.json > $d/cmp_$v.txt 2>&1; done
pk
cat $d/alone.txt; cat $d/probe_api_*.txt | grep -v INFO
for f in mem1 mem2; do grep -A8 "PEAK MEMORY" $d/$f.log | tail -6; done
for v in sp_base sp_hst sp_frag; do echo "== $v"; grep -A14 "PER-KERNEL" $d/$v.log | head -14; done
for v in r_hst r_frag r_base2; do echo "== $v"; tail -8 $d/cmp_$v.txt; done
echo "done at $(el) s"
