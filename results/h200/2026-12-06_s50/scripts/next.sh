#!/usr/bin/env bash
# Prepared by session 50 for the next GPU session (tree final = session 50's last commit, in COMMITS; the checkout must
# be that commit too). On an H200: the figure (h200-bwd phases bwd and fwdbwd, qla), then the memory rows. On
# any other card: the memory rows only (hk16_hv16 / hk8_hv16 x 8k_4seq / 8k_8seq, phase bwd: 811fb35's allocation
# order, expected ~232.5 / ~238.6 MiB at hk16_hv16). Then the whole GPU suite (suite_sharded.sh all; ~210-400 s with the
# carried cache). device run: carry [".device/gpu-env.sh", ".device/gpu-site-py312.tar.xz", ".device/tlcache.tar.xz",
# ".device/s50"], command "bash .device/gpu-env.sh bash .device/s50/next.sh", results/ moved out first.
set -u
. .device/s50/common.sh
call_setup next
cat $d/gpu.txt
if grep -q "H200" $d/gpu.txt; then
  run b_fig 150 final --sweep h200-bwd --phase bwd --backends qla
  run fb_fig 200 final --sweep h200-bwd --phase fwdbwd --backends qla
fi
run s_mem 60 final --cfg hk16_hv16,hk8_hv16 --seqlens 8k_4seq,8k_8seq --phase bwd --backends qla
if [ $(el) -lt 200 ]; then
  bash .device/s50/suite_sharded.sh all > $d/suite.out 2>&1
  echo "suite done at $(el) s"; tail -n 30 $d/suite.out; pk
else
  echo "no time left in this call for the suite: run suite_sharded.sh all in the next call"
fi
echo "done at $(el) s"
