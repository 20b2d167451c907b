"""common/cp_rows.py (the CP backward's piece terminal-gradient rows in one launch) against its torch form, the fill +
index copy backward_cp ran before: on the CPU the plan's table and the torch form are checked against the old two
steps and the kernel compiles for sm_90a; on a GPU the compiled kernel must write the same rows bit for bit and leave
the rows past the plan's pieces alone."""

from __future__ import annotations

import pytest
import torch

from qlabench.kernels.common.cp_rows import dht_rows, dht_rows_kernel, dht_rows_torch
from qlabench.kernels.cp import build_plan

C, D = 64, 128
# long sequences cut into pieces between single-piece ones (last pieces interleaved), and one sequence alone
PLANS = [([0, 8192, 8192 + 3000, 8192 + 3000 + 20480, 8192 + 3000 + 20480 + 64], 8), ([0, 32768], 100)]


def _old_rows(plan, dht, H):
    """backward_cp's rows before cp_rows: zeros, then each sequence's dht into its last piece's row."""
    rows = torch.zeros(plan.n_pieces + 1, H, D, D, dtype=dht.dtype, device=dht.device)
    rows.index_copy_(0, plan.last_piece, dht)
    return rows


@pytest.mark.parametrize("cu, L", PLANS)
def test_table_and_torch_form_give_the_old_rows(cu, L):
    plan = build_plan(cu, L, C, torch.device("cpu"))
    src = plan.dht_src32
    assert src.dtype == torch.int32 and src.shape == (plan.n_pieces,)
    last = set(plan.last_piece.tolist())
    assert [s >= 0 for s in src.tolist()] == [j in last for j in range(plan.n_pieces)]
    assert all(src[j] == plan.pieces[j][2] for j in last)
    H = 3
    dht = torch.randn(len(cu) - 1, H, D, D)
    rows = torch.full((plan.n_pieces + 1, H, D, D), float("nan"))
    dht_rows_torch(dht, src, rows)
    want = _old_rows(plan, dht, H)
    assert torch.equal(rows[:-1], want[:-1])
    assert torch.isnan(rows[-1]).all()  # the chain's scratch row is left alone


def test_compiles_sm90a_with_vector_moves():
    src = dht_rows_kernel(16, D, D, "sm90").get_kernel_source()
    assert "float4" in src and "__launch_bounds__(128" in src
    assert "__shared__" not in src


@pytest.mark.gpu
@pytest.mark.parametrize("H", [4, 16])
@pytest.mark.parametrize("cu, L", PLANS)
def test_kernel_matches_the_torch_form(cu, L, H):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dev = torch.device("cuda")
    plan = build_plan(cu, L, C, dev)
    dht = torch.randn(len(cu) - 1, H, D, D, device=dev)
    got = torch.full((plan.n_pieces + 1, H, D, D), float("nan"), device=dev)
    dht_rows(dht, plan.dht_src32, got, "sm90")
    want = torch.full_like(got, float("nan"))
    dht_rows_torch(dht, plan.dht_src32, want)
    assert torch.equal(got[:-1], want[:-1])
    assert torch.isnan(got[-1]).all()
