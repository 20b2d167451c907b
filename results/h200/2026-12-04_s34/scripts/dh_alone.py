"""Session 33 (probe names for v5: session 34): bwd_dh alone on synthetic inputs: median time and us per chunk step. usage: dh_alone.py H_qk H_v BV [T]"""
import sys

import torch

from qlabench.kernels.common.chunks import chunk_table
from qlabench.kernels.dispatch import kernel_factory

HQ, H, BV = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
T_ = int(sys.argv[4]) if len(sys.argv) > 4 else 32768
C, K, V = 64, 128, 128
dev = "cuda"
torch.manual_seed(0)
kern = kernel_factory("sm90", "bwd_dh_ws")(HQ, H, K, V, BV, C, "bfloat16", "sm90")
table = chunk_table(None, [(0, T_)], 1, T_, C, dev)
nc = T_ // C
q = (torch.randn(T_, HQ, K, device=dev) / K ** 0.5).bfloat16()
k = (torch.randn(T_, HQ, K, device=dev) / K ** 0.5).bfloat16()
do = torch.randn(T_, H, V, device=dev).bfloat16()
Pg = (torch.randn(T_, H, C, device=dev) * 0.1).bfloat16()
Ag = (torch.randn(T_, H, C, device=dev) * 0.1).bfloat16()
fac = torch.empty(nc, H, 3, C, device=dev)
fac[:, :, 0] = 0.9
fac[:, :, 1] = 1.0
fac[:, :, 2] = 0.5
skip = torch.zeros(1, H, dtype=torch.int32, device=dev)
dht = torch.zeros(1, H, K, V, device=dev)
dh = torch.empty(nc, H, K, V, device=dev, dtype=torch.bfloat16)
dvp = torch.empty(T_, H, V, device=dev, dtype=torch.bfloat16)
dh0 = torch.empty(1, H, K, V, device=dev)
for has_skip in (0, 1):
    args = (q, k, do, Pg, Ag, fac, table.cu_seqlens, table.chunk_offsets, table.seq_order, skip, dht, dh, dvp, dh0,
            0.088, has_skip)
    for _ in range(3):
        kern(*args)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); kern(*args); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    med = ts[len(ts) // 2]
    print(f"bwd_dh alone H_qk {HQ} H_v {H} BV {BV} T {T_} has_skip {has_skip}: {med:.1f} us, {med / nc:.3f} us per "
          f"chunk step, grid {V // BV} x {H} = {V // BV * H} blocks, finite {bool(torch.isfinite(dh0).all())}")
    from qlabench.kernels.hopper import bwd_dh_ws
    log = getattr(bwd_dh_ws, "LAST_DHLOG", None)
    if log is not None:
        names = ["s: wait full", "s: wait h_free", "s: dS->dS_s,bar", "s: K dS issue, decay", "s: wait aux_ready",
                 "s: QtE issue, wait(1)", "s: wait pt_ready", "s: dV' form, bar", "s: wait z_ready", "s: Zn^T dV' gemm"]
        if log.shape[-1] == 24:  # v5 (session 34): aux 10-18, producer 19-23
            names += ["a: wait full", "a: zero, eDO, bar", "a: PT gemm", "a: wait pt_free", "a: PT_s store",
                      "a: Age (ldmatrix, scale)", "a: Z gemm (rs)", "a: wait z_free", "a: Zn copy, bar",
                      "p: wait empty", "p: TMA loads", "p: wait s_ready", "p: dh TMA, wait v_ready",
                      "p: dV' store, wait read"]
            groups = [("state", 0, 10), ("aux", 10, 19), ("producer", 19, 24)]
        else:  # v3 (session 33)
            names += ["a: wait full", "a: zero, eDO, bar", "a: PT gemm", "a: wait pt_free", "a: PT_s store",
                      "a: Age form", "a: Z gemm (rs)", "a: wait z_free", "a: Zn copy, bar", "a: wait s_ready",
                      "a: dh store", "a: wait v_ready", "a: dV' store"]
            groups = [("state", 0, 10), ("aux", 10, 23)]
        mean = log.double().cpu().mean(dim=(0, 1)) / nc
        for i, n in enumerate(names):
            print(f"  {n:26s} {mean[i]:8.0f} cycles per chunk")
        print("  " + ", ".join(f"{g} total {mean[a:b].sum():.0f}" for g, a, b in groups))
