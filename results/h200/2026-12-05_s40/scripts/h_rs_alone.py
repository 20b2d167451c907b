"""Session 40: bwd_h_rs (transposed state, both chain products with A in registers) against bwd_h_ws on the same
inputs: h agreement (relative L2, varlen with partial chunks and an empty sequence) and the kernels alone at T = 32768
in one sequence (median of 10, us per chunk step). usage: h_rs_alone.py"""
import torch

from qlabench.kernels.common.chunks import chunk_table
from qlabench.kernels.hopper.bwd_h_rs import bwd_h_rs_kernel
from qlabench.kernels.hopper.bwd_h_ws import bwd_h_ws_kernel

C, K, V = 64, 128, 128
dev = "cuda"


def inputs(HQ, H, cu, seed=0):
    torch.manual_seed(seed)
    T_ = cu[-1] + 37  # a padding tail past the last sequence
    seqs = [(cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    table = chunk_table(torch.tensor(cu, dtype=torch.int32, device=dev), seqs, 1, T_, C, dev)
    nc = table.n_chunks_max
    k = (torch.randn(T_, HQ, K, device=dev) / K ** 0.5).bfloat16()
    v = torch.randn(T_, H, V, device=dev).bfloat16()
    A = (torch.randn(T_, H, C, device=dev) * 0.1).bfloat16()
    fac = torch.empty(nc, H, 3, C, device=dev)
    fac[:, :, 0] = torch.rand(nc, H, C, device=dev) * 0.5 + 0.5
    fac[:, :, 1] = torch.rand(nc, H, C, device=dev) * 0.5 + 0.5
    fac[:, :, 2] = torch.rand(nc, H, C, device=dev)
    h0 = torch.randn(len(seqs), H, K, V, device=dev)
    return table, nc, (k, v, A, fac, table.cu_seqlens, table.chunk_offsets, table.seq_order, h0)


def run(kern, table, nc, args, H):
    h = torch.full((nc, H, K, V), float("nan"), device=dev, dtype=torch.bfloat16)
    kern(*args, h)
    return h


for HQ, H in ((16, 32), (2, 4)):
    cu = [0, 1000, 1000, 1001, 5000, 9001]
    table, nc, args = inputs(HQ, H, cu)
    ref = run(bwd_h_ws_kernel(HQ, H, K, V, 64, C, "bfloat16", "sm90"), table, nc, args, H).float()
    got = run(bwd_h_rs_kernel(HQ, H, K, V, 64, C, "bfloat16", "sm90"), table, nc, args, H).float()
    used = torch.isfinite(ref).all(dim=(1, 2, 3))
    err = ((got[used] - ref[used]).norm() / ref[used].norm()).item()
    print(f"h agreement ({HQ}, {H}) varlen: rel L2 {err:.2e}, rs finite where ws is: "
          f"{bool(torch.isfinite(got[used]).all())}, rows {int(used.sum())}")

for HQ, H in ((16, 32), (16, 64), (16, 16), (2, 4)):
    T_ = 32768
    table, nc, args = inputs(HQ, H, [0, T_])
    for name, kern in (("ws", bwd_h_ws_kernel(HQ, H, K, V, 64, C, "bfloat16", "sm90")),
                       ("rs", bwd_h_rs_kernel(HQ, H, K, V, 64, C, "bfloat16", "sm90"))):
        h = torch.empty(nc, H, K, V, device=dev, dtype=torch.bfloat16)
        for _ in range(3):
            kern(*args, h)
        torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); kern(*args, h); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
        med = sorted(ts)[5]
        print(f"bwd_h {name} ({HQ}, {H}, BV 64) T {T_}: {med:.1f} us, {med / nc:.3f} us per chunk step")
