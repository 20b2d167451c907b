#!/usr/bin/env bash
# Session 29 call 2 (branch wip/s29-prefetch, QLABENCH_FUSED_PREFETCH=0 = main's bwd_fused): stall reasons of bwd_fused
# and bwd_chunk (ncu metrics) at hk16_hv16 1x32768; the per-kernel split at 32k_2seq, default and cp=on+bwd_dh=fused.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
[ -d .device/tlcache/0.1.15 ] || tar -xJf .device/tlcache.tar.xz -C .device/
export TILELANG_CACHE_DIR=$PWD/.device/tlcache QLABENCH_FUSED_PREFETCH=0
export QLABENCH_GIT_COMMIT=$(cat .device/s29/HEAD)+p0
d=/tmp/c2_$t0; mkdir -p $d
save() { tar -C $d -cf $OUT/c2.tar .; }
timeout 120 python -m qlabench run --arch sm90 --cfg hk16_hv16 --seqlens 32k_2seq --phase bwd \
  --backends qla,qla:cp=on+bwd_dh=fused --kernel-split --no-progress --out $d/split32k2.json > $d/split32k2.log 2>&1
echo "split rc $? at $(el) s"; save
M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,smsp__sass_inst_executed_op_shared_ld.sum,smsp__sass_inst_executed_op_shared_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,regex:sm__pipe_tensor_op.*cycles_active\.avg\.pct_of_peak_sustained_active,gpu__time_duration.sum'
q() {  # backend kernel-regex name
  timeout 120 ncu --target-processes all --kernel-name regex:"$2" --launch-count 1 --metrics "$M" \
    python -m qlabench run --arch sm90 --cfg hk16_hv16 --seqlens 1x32768 --phase bwd --backends $1 --warmup 0 \
      --repeats 1 --timer events --no-progress --out /tmp/ncu-$3-$t0.json > $d/ncu-$3.txt 2>&1
  echo "ncu $3 rc $? at $(el) s"; save
}
q qla bwd_fused_kernel fused
q qla:bwd_dh=ws bwd_chunk_kernel chunk
q qla bwd_h_ws_kernel bwdh
grep -B2 -A24 "PER-KERNEL" $d/split32k2.log | head -40
for n in fused chunk bwdh; do echo "== $n"; grep -E "stalled|inst_executed|bank_conflicts|tensor|duration" $d/ncu-$n.txt \
  | awk '$NF+0 > 0.05 || /inst|bank|tensor|duration/' | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' \
  | awk '{print $1, $(NF)}' | sort -k2 -gr | head -24; done
