"""Session 31 (session 30's, with head counts): which buffers are live at the backward's (or the training step's) peak
(torch.cuda.memory history), the API default.
usage: memsnap.py <lens e.g. 7212+25556> [bwd|fwdbwd] [H_qk H_v (default 16 16)]"""
import sys
import torch
import torch.nn.functional as F
from qlabench.kernels import chunk_gated_delta_rule

lens = [int(x) for x in sys.argv[1].split("+")]
phase = sys.argv[2] if len(sys.argv) > 2 else "bwd"
HQ, H = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (16, 16)
D = 128
T = sum(lens)
torch.manual_seed(0)
dev = "cuda"
q = F.normalize(torch.randn(1, T, HQ, D, device=dev), dim=-1).bfloat16().requires_grad_()
k = F.normalize(torch.randn(1, T, HQ, D, device=dev), dim=-1).bfloat16().requires_grad_()
v = torch.randn(1, T, H, D, device=dev).bfloat16().requires_grad_()
g = F.logsigmoid(torch.randn(1, T, H, device=dev) + 4.0).requires_grad_()
beta = torch.sigmoid(torch.randn(1, T, H, device=dev)).requires_grad_()
h0 = torch.randn(len(lens), H, D, D, device=dev).requires_grad_()
cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=dev) if len(lens) > 1 else None
for _ in range(2):
    o = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0)[0]
    o.backward(torch.randn_like(o))
torch.cuda.synchronize()
do = torch.randn(1, T, H, D, device=dev).bfloat16()
if phase == "bwd":
    o = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0)[0]
torch.cuda.synchronize()
base = torch.cuda.memory_allocated()
torch.cuda.reset_peak_memory_stats()
torch.cuda.memory._record_memory_history(max_entries=100000)
if phase != "bwd":
    o = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0)[0]
o.backward(do)
torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
peak = torch.cuda.max_memory_allocated() - base
print(f"H_qk {HQ} H_v {H} lens {lens} phase {phase}: peak extra {peak / 2**20:.1f} MiB")
live, cur, best, best_set = {}, 0, -1, None
for tr in snap["device_traces"]:
    for e in tr:
        a = e["action"]
        if a == "alloc":
            live[e["addr"]] = (e["size"], e["frames"])
            cur += e["size"]
            if cur > best:
                best, best_set = cur, dict(live)
        elif a == "free_completed" and e["addr"] in live:
            cur -= live.pop(e["addr"])[0]
print(f"replayed peak of allocations made during the call: {best / 2**20:.1f} MiB")


def where(frames):
    out = []
    for f in frames:
        fn = f["filename"]
        if "qlabench" in fn or "memsnap" in fn:
            out.append(f"{fn.split('qlabench/')[-1]}:{f['line']}")
        if len(out) == 2:
            break
    return " < ".join(out) or (frames[0]["filename"] + ":" + str(frames[0]["line"]) if frames else "?")


rows = sorted(best_set.values(), key=lambda x: -x[0])
agg = {}
for s, fr in rows:
    w = where(fr)
    agg[w] = agg.get(w, 0) + s
for w, s in sorted(agg.items(), key=lambda x: -x[1]):
    print(f"{s / 2**20:9.1f} MiB  {w}")
