"""common/cp_tables.py (the CP forward's warm-up tables in one launch, and the backward's local-pass skips)
against forward_cp.warmup_tables and backward_cp.local_skips, their torch forms: on the CPU its loop is mirrored in Python over the plan's int32 tables and it compiles
for sm_90a; on a GPU the compiled kernel must give the same int32 tables bit for bit."""

from __future__ import annotations

import pytest
import torch

from qlabench.kernels.common.chunks import chunk_table
from qlabench.kernels.common.cp_tables import cp_tables_kernel
from qlabench.kernels.common.cumsum import chunk_local_cumsum
from qlabench.kernels.cp import build_plan
from qlabench.kernels.emulate_fwd import twin_chunk_local_cumsum
from qlabench.kernels.forward_cp import warmup_tables

C = 64
# sequences (cu_seqlens), piece length in chunks: long ones cut into pieces, short ones whole,
# partial last chunks, one piece longer than the kernel's 64-row staging step
PLANS = [([0, 8192, 8192 + 3000, 8192 + 3000 + 20480], 8), ([0, 32768], 100), ([0, 100, 12345], 16)]


def _inputs(cu, H, gate_scale, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = cu[-1]
    g = -gate_scale * torch.rand(T, H, generator=gen)  # log-decays in [-scale, 0]
    g[:, 0] = 0.0  # a head that never decays: falls back wherever its piece is needed
    g = g.to(device)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    table = chunk_table(cu_t, [(cu[i], cu[i + 1]) for i in range(len(cu) - 1)], 1, T, C, device)
    cumsum = chunk_local_cumsum if device.type == "cuda" else twin_chunk_local_cumsum
    return cumsum(g, table, C, "sm90")


def _mirror(plan, g_cumsum, threshold, direction="forward"):
    """The kernel's loop in Python over pass1_rev_last32 / pass1_piece32 (bwd_fwd_last32 / bwd_piece32
    backward; fp64 running sum; needed = 2 never truncates)."""
    last, piece = ((plan.pass1_rev_last32, plan.pass1_piece32) if direction == "forward"
                   else (plan.bwd_fwd_last32, plan.bwd_piece32))
    last, piece = last.tolist(), piece.tolist()
    P1, H = len(piece), g_cumsum.shape[1]
    skip_local = torch.zeros(P1, H, dtype=torch.int32)
    skip_m = torch.zeros(P1, H, dtype=torch.int32)
    flag = torch.zeros(P1 + 1, H, dtype=torch.int32)
    gam = g_cumsum.double().cpu()
    for j, (m, needed) in enumerate(piece):
        for h in range(H):
            s, first = 0.0, len(last[j])
            for r, tok in enumerate(last[j]):
                s += float(gam[tok, h]) if tok >= 0 else 0.0
                if threshold is not None and s < threshold and first == len(last[j]):
                    first = r
            reached = threshold is not None and first < len(last[j]) and needed == 1
            fallback = bool(needed) and not reached
            skip_local[j, h] = (m - first - 1 if reached else 0) if needed else m
            skip_m[j, h] = 0 if fallback else m
            flag[j, h] = int(fallback)
    return skip_local, skip_m, flag


@pytest.mark.parametrize("cu,L", PLANS)
@pytest.mark.parametrize("threshold", [-10.0, None])
def test_kernel_loop_matches_warmup_tables(cu, L, threshold):
    plan = build_plan(cu, L, C, torch.device("cpu"))
    assert plan.pass1 is not None
    g_cumsum = _inputs(cu, 6, 0.3, torch.device("cpu")).float()
    want = warmup_tables(plan, g_cumsum, threshold)
    got = _mirror(plan, g_cumsum, threshold)
    for w, x in zip(want, got):
        assert torch.equal(w.cpu(), x)


@pytest.mark.parametrize("cu,L", PLANS)
@pytest.mark.parametrize("threshold", [-10.0, -3.0, None])
def test_backward_direction_loop_matches_local_skips(cu, L, threshold):
    """The same loop over the backward's tables (pieces walked from their start; first pieces skip all,
    last pieces none) is backward_cp.local_skips."""
    from qlabench.kernels.backward_cp import local_skips

    plan = build_plan(cu, L, C, torch.device("cpu"))
    g_cumsum = _inputs(cu, 6, 0.3, torch.device("cpu")).float()
    want = local_skips(plan, g_cumsum, threshold)
    got = _mirror(plan, g_cumsum, threshold, "backward")[0]
    assert torch.equal(want.cpu(), got)


def test_compiles_for_sm90a():
    src = cp_tables_kernel(16, "sm90").get_kernel_source()
    assert "double" in src  # the running sum is fp64, as warmup_tables' cumsum


@pytest.mark.gpu
@pytest.mark.parametrize("cu,L", PLANS)
@pytest.mark.parametrize("threshold", [-10.0, -3.0, None])
def test_kernel_matches_warmup_tables_on_the_gpu(cu, L, threshold):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from qlabench.kernels.common.cp_tables import cp_tables
    from qlabench.kernels.dispatch import arch_for_device

    dev = torch.device("cuda")
    plan = build_plan(cu, L, C, dev)
    g_cumsum = _inputs(cu, 16, 0.3, dev)
    want = warmup_tables(plan, g_cumsum, threshold)
    got = cp_tables(plan, g_cumsum, threshold, arch_for_device(dev).name)
    for name, w, x in zip(("skip_local", "skip_m", "flag"), want, got):
        assert torch.equal(w, x), (name, cu, L, threshold)
    from qlabench.kernels.backward_cp import local_skips

    got = cp_tables(plan, g_cumsum, threshold, arch_for_device(dev).name, "backward")[0]
    assert torch.equal(local_skips(plan, g_cumsum, threshold), got), ("backward", cu, L, threshold)
