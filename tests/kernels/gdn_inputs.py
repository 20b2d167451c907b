"""Random GDN inputs for kernel tests (fresh per call) and the relative-L2 metric."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from qlabench import workload

# The tests' gate names and the qlabench.workload profile each one draws: the gates come from
# workload.make_gate, the suite's one definition (tests/test_workload.py checks that they do).
# "qwen" is workload's "qwen_strong_last": the same as the suite's qwen at h_v >= 2, and with a single
# v-head that head decays at A = 16 as these tests have always drawn it (the suite's qwen leaves it at
# A = 0, an undecayed head).
GATE_PROFILE = {"bench": "bench", "qwen": "qwen_strong_last", "extreme": "extreme", "logsigmoid": "logsigmoid"}


def make_inputs(T, h_qk, h_v, *, cu_seqlens=None, B=1, gate="bench", h0=False, state_v_first=False,
                dtype=torch.bfloat16, device="cuda", D=128, seed=None):
    """q, k l2-normalised, v, g (``gate``: a key of GATE_PROFILE), beta = sigmoid(randn), optional h0;
    B = 1 with cu_seqlens."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(torch.randint(0, 2**31 - 1, (1,)).item()) if seed is None else seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    q = F.normalize(randn(B, T, h_qk, D), dim=-1)
    k = F.normalize(randn(B, T, h_qk, D), dim=-1)
    v = randn(B, T, h_v, D)
    if gate not in GATE_PROFILE:
        raise ValueError(f"unknown gate {gate!r}; known: {', '.join(GATE_PROFILE)}")
    g = workload.make_gate(GATE_PROFILE[gate], T, h_v, gen, "cpu", batch=B)
    beta = torch.sigmoid(randn(B, T, h_v))
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    out = {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype), "g": g.float(), "beta": beta.float()}
    if cu_seqlens is not None:
        out["cu_seqlens"] = torch.tensor(cu_seqlens, dtype=torch.int32)
    if h0:
        shape = (N, h_v, D, D)
        out["initial_state"] = randn(*shape).float()
    out["state_v_first"] = state_v_first
    return {key: (val.to(device) if isinstance(val, torch.Tensor) else val) for key, val in out.items()}


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64; inf when x has NaN/Inf. The kernel tests' one definition (the
    suite's is qlabench.check.rel_l2, which gives NaN there: a results file records it; an inf here
    keeps ``max()`` of several errors failing whichever comes first)."""
    x = x.double()
    ref = ref.double()
    if not torch.isfinite(x).all():
        return float("inf")
    den = ref.norm().item()
    num = (x - ref).norm().item()
    return num / den if den > 0 else num


def poison_cuda_cache(nbytes: int = 1 << 30) -> None:
    """Fills freed allocator blocks with NaN so kernel outputs allocated next start as NaN."""
    if torch.cuda.is_available():
        buf = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
        buf.fill_(float("nan"))
        del buf


def random_varlen(seed: int) -> tuple[list[int], int]:
    """(cu_seqlens, T) of 3-20 sequences, always including lengths 1, 33, 63, 64 and 65, in a seeded
    order, followed by a padding tail of 0, 5, 64 or 130 tokens."""
    rng = random.Random(seed)
    n_seq = rng.randint(3, 20)
    lengths = [1, 33, 63, 64, 65] + [rng.randint(1, 700) for _ in range(n_seq - 5)]
    rng.shuffle(lengths)
    tail = rng.choice([0, 5, 64, 130])
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu, cu[-1] + tail
