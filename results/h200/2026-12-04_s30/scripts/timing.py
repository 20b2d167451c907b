"""Session 29 diagnostic (branch wip/s29-timing): bwd_fused's clock64 phase times per warpgroup, hk16_hv16, the API's
default training step (CP, bwd_fused), for the given token layout. Prints mean cycles per chunk per phase."""
import sys

import torch
import torch.nn.functional as F

from qlabench.kernels import backward, chunk_gated_delta_rule

lens = [int(x) for x in sys.argv[1].split("+")] if len(sys.argv) > 1 else [32768]
H, D = 16, 128
T = sum(lens)
torch.manual_seed(0)
dev = "cuda"
q = F.normalize(torch.randn(1, T, H, D, device=dev), dim=-1).bfloat16().requires_grad_()
k = F.normalize(torch.randn(1, T, H, D, device=dev), dim=-1).bfloat16().requires_grad_()
v = torch.randn(1, T, H, D, device=dev).bfloat16().requires_grad_()
g = F.logsigmoid(torch.randn(1, T, H, device=dev) + 4.0).requires_grad_()
beta = torch.sigmoid(torch.randn(1, T, H, device=dev)).requires_grad_()
cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=dev) if len(lens) > 1 else None
names = ["top_bar", "issue+scal+dS_s", "ld_wait", "zero+BAR_LOADED", "U,KdS,P,Ag+wait", "Pg", "BAR_AG",
         "dV'+BAR_LOCAL", "dv_du_w(+BAR_W)", "V'", "BAR_VP", "dAb,dPg", "masks(+BAR_MASKS)", "eDO+dS issue",
         "q:dg_tail k:dAs K", "store", "(1a) TMA issue", "(1b) scalars", "(1b') scalars first", "-",
         "B0 q:dq0+rowdot k:mask term", "B1 q:dPK,A^TdA k:V'dS^T", "B2 q:T1,T2,KK k:dk r,kt1",
         "B3 q:BAR_XREAD k:dUS0+dP^TQ", "B4 q:wy_inv k:sv_rows", "B5 both:BAR_HANDOFF", "-", "-", "-", "-", "-", "-"]
for it in range(4):
    o = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)[0]
    o.backward(torch.randn_like(o))
    torch.cuda.synchronize()
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
ts = []
for it in range(10):
    o = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)[0]
    do = torch.randn_like(o)
    torch.cuda.synchronize()
    ev[0].record()
    o.backward(do)
    ev[1].record()
    torch.cuda.synchronize()
    ts.append(ev[0].elapsed_time(ev[1]))
print("backward ms (median of 10):", sorted(ts)[5])
tl = backward.LAST_TLOG.double().cpu()  # [n, H, 2, 16] cycles summed over each block's chunks
print("blocks", tl.shape[0] * tl.shape[1])
tot = tl.sum(-1)  # per block per wg
# chunks per block: unknown here; report per block mean cycles and shares
mean = tl.mean(dim=(0, 1))  # [2, 16]
for i, n in enumerate(names):
    print(f"{n:22s} wg0 {mean[0, i]:12.0f}  wg1 {mean[1, i]:12.0f}   ({100 * mean[0, i] / mean[0].sum():5.1f}% / "
          f"{100 * mean[1, i] / mean[1].sum():5.1f}%)")
print(f"{'total':22s} wg0 {mean[0].sum():12.0f}  wg1 {mean[1].sum():12.0f}")
print("block totals min/max (wg0):", float(tot[..., 0].min()), float(tot[..., 0].max()))
