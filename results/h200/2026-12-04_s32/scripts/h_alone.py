"""Session 32: bwd_h alone (no bwd_dh beside it) on synthetic inputs: median time, us per chunk step, and, where the
module is the probed one (LAST_HLOG), the phase split. usage: h_alone.py H_qk H_v BV [T]"""
import sys

import torch

from qlabench.kernels.common.chunks import chunk_table
from qlabench.kernels.dispatch import kernel_factory
from qlabench.kernels.hopper import bwd_h_ws

HQ, H, BV = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
T_ = int(sys.argv[4]) if len(sys.argv) > 4 else 32768
C, K, V = 64, 128, 128
dev = "cuda"
torch.manual_seed(0)
kern = kernel_factory("sm90", "bwd_h")(HQ, H, K, V, BV, C, "bfloat16", "sm90")
table = chunk_table(None, [(0, T_)], 1, T_, C, dev)
nc = T_ // C
k = (torch.randn(T_, HQ, K, device=dev) / K ** 0.5).bfloat16()
v = torch.randn(T_, H, V, device=dev).bfloat16()
A = (torch.randn(T_, H, C, device=dev) * 0.1).bfloat16()
fac = torch.empty(nc, H, 3, C, device=dev)
fac[:, :, 0] = 0.9
fac[:, :, 1] = 1.0
fac[:, :, 2] = 0.5
h0 = torch.zeros(1, H, K, V, device=dev)
h = torch.empty(nc, H, K, V, device=dev, dtype=torch.bfloat16)
args = (k, v, A, fac, table.cu_seqlens, table.chunk_offsets, table.seq_order, h0, h)
for _ in range(3):
    kern(*args)
torch.cuda.synchronize()
ts = []
for _ in range(10):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); kern(*args); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
ts.sort()
med = ts[len(ts) // 2]
print(f"bwd_h alone H_qk {HQ} H_v {H} BV {BV} T {T_}: {med:.1f} us, {med / nc:.3f} us per chunk step, "
      f"grid {V // BV} x {H} = {V // BV * H} blocks, finite {bool(torch.isfinite(h.float()).all())}")
log = getattr(bwd_h_ws, "LAST_HLOG", None)
if log is not None:
    names = ["s: wait full", "s: wait h_free", "s: S -> S_s", "s: BAR_STATE + s_ready", "s: K S gemm",
             "s: Y -> Y_s", "s: BAR_STATE", "s: wait x_ready", "s: S *= e_C", "s: X^T Y gemm", "t: wait full",
             "t: wait x_free", "t: Ab, K zero, bar", "t: X gemm -> X_s, bar", "t: wait s_ready", "t: h store"]
    mean = log.double().cpu().mean(dim=(0, 1)) / nc
    for i, n in enumerate(names):
        print(f"  {n:26s} {mean[i]:8.0f} cycles per chunk")
    print(f"  state total {mean[:10].sum():.0f}, transition total {mean[10:].sum():.0f}")
