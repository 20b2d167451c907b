"""Compile bwd_dh_ws of the tree on PYTHONPATH at the suite's 13 (H_qk, H_v) pairs x BV 32, 64; print the
cubin's spill / register usage (cuobjdump -res-usage)."""
import glob
import os
import subprocess
import sys
import time

from qlabench.kernels.dispatch import kernel_factory

role = sys.argv[1] if len(sys.argv) > 1 else "bwd_dh_ws"
pairs = [(16, 16), (16, 32), (8, 16), (4, 8), (2, 4), (16, 64), (2, 8), (4, 4), (4, 16), (1, 1), (2, 2), (1, 4), (8, 8)]
lane = int(os.environ.get("LANE", "0")); lanes = int(os.environ.get("LANES", "1"))
cuobj = "/tmp/pipdl/x/nvidia/cu13/bin/cuobjdump"
for i, (hq, hv) in enumerate(pairs):
    for bv in (32, 64):
        if (2 * i + (bv == 64)) % lanes != lane:
            continue
        t = time.time()
        kernel_factory("sm90", role)(hq, hv, 128, 128, bv, 64, "bfloat16", "sm90")
        cub = max(glob.glob(os.environ["TILELANG_CACHE_DIR"] + "/0.1.15/cuda-binaries/*/kernel.cubin"), key=os.path.getmtime)
        res = subprocess.run([cuobj, "-res-usage", cub], capture_output=True, text=True, check=False).stdout
        line = [l.strip() for l in res.splitlines() if "REG" in l]
        print(f"{role} ({hq},{hv},{bv}) {time.time() - t:.0f}s {line[:1]}", flush=True)
