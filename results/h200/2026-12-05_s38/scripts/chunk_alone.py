"""Session 35 (38: the persistent grid): bwd_chunk alone on synthetic inputs (one sequence of T tokens): median time, us per (chunk, v-head)
item, and with the probe build (wip/s35-chunk-probe: qlabench.kernels.backward.LAST_CLOG's layout, the kernel taking
a tlog argument) the clock64 phase split per warpgroup. usage: chunk_alone.py H_qk H_v [T]"""
import sys

import torch

from qlabench.kernels.common.chunks import chunk_table
from qlabench.kernels.dispatch import kernel_factory

HQ, H = int(sys.argv[1]), int(sys.argv[2])
T_ = int(sys.argv[3]) if len(sys.argv) > 3 else 32768
C, K, V = 64, 128, 128
G = H // HQ
dev = "cuda"
torch.manual_seed(0)
kern = kernel_factory("sm90", "bwd_chunk")(HQ, H, K, V, C, "bfloat16", "sm90")
table = chunk_table(None, [(0, T_)], 1, T_, C, dev)
nc = T_ // C
bf = torch.bfloat16
q = (torch.randn(T_, HQ, K, device=dev) / K ** 0.5).to(bf)
k = (torch.randn(T_, HQ, K, device=dev) / K ** 0.5).to(bf)
v = torch.randn(T_, H, V, device=dev).to(bf)
do = torch.randn(T_, H, V, device=dev).to(bf)
dvp = torch.randn(T_, H, V, device=dev).to(bf)
pos = torch.arange(T_, device=dev) % C
gcs = (-0.05 * (pos + 1)).float()[:, None].expand(T_, H).contiguous()
beta = torch.full((T_, H), 0.5, device=dev)
causal = (torch.arange(C, device=dev)[None, :] <= pos[:, None]).float()  # A_k[t, j] = 0 past t's position
A = (torch.randn(T_, H, C, device=dev) * 0.1 * causal[:, None, :]).to(bf)
h = (torch.randn(nc, H, K, V, device=dev) * 0.1).to(bf)
dh = (torch.randn(nc, H, K, V, device=dev) * 0.1).to(bf)
dq = torch.empty(T_, HQ, K, device=dev, dtype=bf)
dk = torch.empty_like(dq)
dbeta = torch.empty(T_, H, device=dev)
dg = torch.empty(T_, H, device=dev)
probed = False
try:
    from qlabench.kernels.hopper.bwd_chunk_steps import N_PROBE
    probed = True
except ImportError:
    pass
args = [q, k, v, do, dvp, gcs, beta, A, h, dh, table.chunk_bounds, dq, dk, dbeta, dg]
try:  # session 38: the persistent build takes its grid as a tensor length before scale
    from qlabench.kernels.backward import persistent_grid
    args.append(persistent_grid(table.chunk_bounds.shape[0] * HQ, dev))
except ImportError:
    pass
if probed:
    tlog = torch.zeros(table.chunk_bounds.shape[0], HQ, 2, G, N_PROBE, dtype=torch.int64, device=dev)
    args.append(tlog)
args.append(0.088)
for _ in range(3):
    kern(*args)
torch.cuda.synchronize()
ts = []
for _ in range(10):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); kern(*args); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
ts.sort()
med = ts[len(ts) // 2]
print(f"bwd_chunk alone H_qk {HQ} H_v {H} T {T_}: {med:.1f} us, {med * 132 / (nc * H):.3f} us per (chunk, v-head) item "
      f"per SM (132 SMs), grid {table.chunk_bounds.shape[0]} x {HQ}, finite {bool(torch.isfinite(dg).all())}")
if probed:
    names = ["BAR_TOP wait", "loads issue, scalars, wait S0", "U issue, wait V/A/dV', BAR_LOADED",
             "Ag columns, BAR_AG", "dv, dU, W (BAR_W)", "V' = Ag W, wait dO, V' copy, BAR_VP", "dAb, dPg, P + wait",
             "masks (BAR_MASKS)"]
    br = [["dq0 + rowdot", "dP K, A^T dA", "T1 copy, T1 A^T, K K^T", "BAR_XREAD wait", "wy_inverse_grad",
           "BAR_HANDOFF wait", "dg_tail"],
          ["mask term", "wait dS, V' dS^T", "r-terms (kt1)", "dU S0^T + dP^T Q", "sv_sum", "BAR_HANDOFF wait",
           "dAs K"]]
    lg = tlog[:nc].double().cpu()  # [nc, HQ, 2, G, N_PROBE]
    per_item = lg[..., :15].mean(dim=(0, 1, 3))  # [2, 15]: cycles per (chunk, v-head) item
    per_block = lg[:, :, :, 0, 15:].mean(dim=(0, 1))  # [2, 2]: store_rows, prologue per block
    for w in (0, 1):
        print(f"  warpgroup {w} ({'dq' if w == 0 else 'dk'} branch), cycles per (chunk, v-head) item:")
        for i, n in enumerate(names + br[w]):
            print(f"    {i:2d} {n:40s} {per_item[w, i]:8.0f}")
        print(f"    item total {per_item[w].sum():.0f}; per block: store_rows {per_block[w, 0]:.0f}, "
              f"prologue {per_block[w, 1]:.0f}")
    if G > 1:
        for g in range(G):
            print(f"  v-head {g} of the group: wg0 total {lg[:, :, 0, g, :15].sum(-1).mean():.0f}, "
                  f"phase 0-2 {lg[:, :, 0, g, :3].sum(-1).mean():.0f}")
