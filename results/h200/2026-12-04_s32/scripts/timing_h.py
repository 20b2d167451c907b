"""Session 32 diagnostic (branch wip/s32-hprobe): bwd_h_ws's clock64 phase sums per warpgroup, the API's default
backward for H_qk, H_v and a token layout. Prints cycles per chunk per phase (state warpgroup: 0-9, transition: 10-15).
usage: timing_h.py H_qk H_v [lens e.g. 32768 or 7212+25556]"""
import sys

import torch
import torch.nn.functional as F

from qlabench.kernels import chunk_gated_delta_rule
from qlabench.kernels.hopper import bwd_h_ws

HQ, H = int(sys.argv[1]), int(sys.argv[2])
lens = [int(x) for x in sys.argv[3].split("+")] if len(sys.argv) > 3 else [32768]
D, T = 128, sum(lens)
torch.manual_seed(0)
dev = "cuda"
q = F.normalize(torch.randn(1, T, HQ, D, device=dev), dim=-1).bfloat16().requires_grad_()
k = F.normalize(torch.randn(1, T, HQ, D, device=dev), dim=-1).bfloat16().requires_grad_()
v = torch.randn(1, T, H, D, device=dev).bfloat16().requires_grad_()
g = F.logsigmoid(torch.randn(1, T, H, device=dev) + 4.0).requires_grad_()
beta = torch.sigmoid(torch.randn(1, T, H, device=dev)).requires_grad_()
cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=dev) if len(lens) > 1 else None
names = ["s: wait full", "s: wait h_free", "s: S -> S_s", "s: BAR_STATE + s_ready", "s: K S gemm", "s: Y -> Y_s",
         "s: BAR_STATE", "s: wait x_ready", "s: S *= e_C", "s: X^T Y gemm", "t: wait full", "t: wait x_free",
         "t: Ab, K zero, bar", "t: X gemm -> X_s, bar", "t: wait s_ready", "t: h store"]
for _ in range(3):
    o = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)[0]
    o.backward(torch.randn_like(o))
torch.cuda.synchronize()
log = bwd_h_ws.LAST_HLOG.double().cpu()  # [NV, blocks, 16]
nv, nb = log.shape[:2]
chunks = sum(-(-n // 64) for n in lens) * H / (nb // 1)  # chunks per block (pieces under CP differ; mean)
mean = log.mean(dim=(0, 1))
print(f"H_qk {HQ} H_v {H} lens {lens}: grid {nv} x {nb} blocks, ~{chunks:.1f} chunks per block")
for i, n in enumerate(names):
    print(f"{n:26s} {mean[i] / chunks:9.0f} cycles per chunk")
print(f"{'state total':26s} {mean[:10].sum() / chunks:9.0f}   transition total {mean[10:].sum() / chunks:9.0f}")
