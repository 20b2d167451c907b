"""bwd_dh=fused's host orchestration (backward._bwd_fused, backward_cp's fused branch) on the float64 twins, without a
GPU: the same gradients as the reference autograd, on the plain path and over CP pieces (bwd_fused from each piece's
end gradient); the kernel itself (hopper/bwd_fused.py) compiles on the CPU, its GPU check is test_bwd_fused_gpu.py."""

from __future__ import annotations

import pytest
import torch

from qlabench.kernels import backward
from qlabench.kernels.cp import plan_cp
from qlabench.kernels.emulate_bwd import FUSED_TWINS, KERNEL_TWINS, twin_bwd_dh_pipelined
from qlabench.kernels.validate import validate

from .test_backward_cp import EXACT, NAMES, _assert_close, _problem, _run_cp

FUSED = {**{n: f for n, f in KERNEL_TWINS.items() if n != "bwd_chunk"}, **FUSED_TWINS}
PLAIN = 1e-6  # the plain backward stages beta in fp32 (backward._bwd_impl) even on float64 inputs


def _problem_args(args):
    return validate(args["q"], args["k"], args["v"], args["g_cumsum"], args["beta"], None, args["initial_state"],
                    args["cu_seqlens"], args["state_v_first"])


def _plain(args, kernels):
    p = _problem_args(args)
    return dict(zip(NAMES, backward._bwd_impl(
        p, args["q"], args["k"], args["v"], args["g_cumsum"], args["beta"], args["A"], args["do"], args["dht"],
        args["initial_state"], args["cu_seqlens"], args["state_v_first"], args["C"], kernels)))


def _cp(args, L, twins, calls=None):
    """The CP backward over pieces of L chunks on ``twins``, as test_backward_cp's (truncation threshold -10)."""
    return _run_cp(args, L, threshold=-10.0, calls=calls, twins=twins)


@pytest.mark.parametrize("case", ["dense-h0", "varlen-tail-dht"])
def test_plain_fused_matches_the_reference(case):
    if case == "dense-h0":
        want, args = _problem(70, 2, 2, B=2, h0=True, seed=3)  # 9 chunks of 8, the last partial
    else:  # long, empty, 1 token, partial; a padding tail past cu[-1]
        want, args = _problem(120, 2, 2, cu=[0, 61, 61, 62, 100], h0=True, gates=["strong", "moderate"], seed=4)
    got = _plain(args, FUSED)
    _assert_close(got, want, PLAIN, "fused vs reference autograd: ")
    if args["cu_seqlens"] is not None:
        for name in ("dq", "dk", "dv", "dbeta", "dg"):
            assert (got[name].flatten(0, 1)[100:] == 0).all(), f"{name} not zero on the padding tail"


def test_cp_fused_runs_no_final_reverse_pass_and_matches():
    """Over CP pieces bwd_fused starts every piece from its corrected end gradient: the local pass still runs, the
    final reverse pass and bwd_chunk do not, and the gradients are the reference's."""
    want, args = _problem(300, 2, 2, h0=True, seed=5)  # 38 chunks of 8: 10 pieces of 4, partial last chunk
    calls = []
    got, plan = _cp(args, 4, FUSED, calls)
    assert plan.enabled and plan.n_pieces == 10
    names = [name for name, _, _ in calls]
    assert names.count("bwd_dh") == 1 and names.count("bwd_fused") == 1 and "bwd_chunk" not in names
    _assert_close(got, want, EXACT, "fused CP vs reference autograd: ")


def _twin_bwd_dh_du(q, k, do, Pg, Ag, fac, cu_seqlens, chunk_offsets, seq_order, chunk_skip, dht, dh_out, dvp_out,
                    dh0_out, scale, has_skip):
    """sm90's reverse pass with bwd_fused's rounding of the dS chain (K^T dU, dU staged) where bwd_fused replaces it:
    the final pass; the CP local and transition passes (has_skip) stay bwd_dh_ws's (Zn^T dV', Zn staged), as under
    bwd_dh=fused."""
    twin_bwd_dh_pipelined(q, k, do, Pg, Ag, fac, cu_seqlens, chunk_offsets, seq_order, chunk_skip, dht, dh_out,
                          dvp_out, None, dh0_out, scale, has_skip, rows_with_skip=False, zn=bool(has_skip))


def test_bf16_staging_fused_matches_the_default_kernels():
    """With the kernels' bf16 staging, bwd_dh=fused gives the default kernels' gradients: bit for bit where the reverse
    pass rounds as bwd_fused does (dU staged), and within 5e-3 relative L2 with bwd_dh_ws's own rounding (Zn staged:
    1e-3 to 2.6e-3 on these inputs, dq equal)."""
    _, args = _problem(300, 2, 2, cu=[0, 230, 240, 290], h0=True, seed=9, dtype=torch.bfloat16)
    same_rounding = {**KERNEL_TWINS, "bwd_dh": _twin_bwd_dh_du}
    got, default = _plain(args, FUSED), _plain(args, same_rounding)
    for name in NAMES:
        assert torch.equal(got[name], default[name]), name
    got_cp, _ = _cp(args, 2, FUSED)
    default_cp, _ = _cp(args, 2, same_rounding)
    for name in NAMES:
        assert torch.equal(got_cp[name], default_cp[name]), name
    for fused, kernels in ((got, _plain(args, KERNEL_TWINS)), (got_cp, _cp(args, 2, KERNEL_TWINS)[0])):
        for name in NAMES:
            err = ((fused[name].double() - kernels[name].double()).norm() / kernels[name].double().norm()).item()
            assert err <= 5e-3, (name, err)


def test_fused_needs_one_v_head_per_qk_head():
    with pytest.raises(ValueError, match="H_v == H_qk"):
        backward._kernels(2, 4, "bfloat16", "sm90", 64, "fused")


def test_auto_takes_fused_on_cp_backwards_of_few_chains():
    """bwd_dh=auto (backward.cp_dh_choice): bwd_fused for a CP backward of <= FUSED_MAX_CHAINS effective chains with
    H_v == H_qk on sm90 (measured in sessions 28 to 31); bwd_chunk with GQA, more chains, sm100, or another bwd_dh."""
    from qlabench.kernels.dispatch import arch_by_name

    sm90, sm100 = arch_by_name("sm90"), arch_by_name("sm100")

    def choice(cu, h_qk, h_v, arch=sm90, bwd_dh=None):
        plan = plan_cp(torch.tensor(cu, dtype=torch.int32), heads=h_v, sm_count=132, chunk_size=64, enable=True)
        assert plan.enabled
        return backward.cp_dh_choice(arch, h_qk, h_v, plan, bwd_dh)

    assert backward.FUSED_MAX_CHAINS == 56
    assert choice([0, 32768], 16, 16) == "fused"  # 16 chains: 32k_1seq
    assert choice([0, 8192], 16, 16) == "fused"
    assert choice([0, 30720, 32768], 15, 15) == "fused"  # 15 x 512 / 480 = 16 effective chains
    assert choice([0, 7053, 8192], 16, 16) == "fused"  # 18.6 effective chains: 8k_2seq tied, 0.77x the memory
    # 20.5 effective chains: 32k_2seq, 1.00-1.01x the time, 0.74x the memory
    assert choice([0, 7212, 32768], 16, 16) == "fused"
    assert choice([0, 5809, 8192], 16, 16) == "fused"  # 16 x 129 / 91 = 22.7 effective chains: 8k_4seq-like, 0.96
    assert choice([0, 3274, 4303, 7212, 12273, 14284, 18077, 28009, 32768], 16, 16) == "fused"  # 53.1: 32k_8seq, 0.93
    assert choice([0, 32768], 64, 64) == "auto"  # 64 chains
    assert choice([0, 32768], 16, 32) == "auto"  # GQA: no group reduction in bwd_fused
    assert choice([0, 32768], 16, 16, sm100) == "auto"
    assert choice([0, 32768], 16, 16, bwd_dh="ws") == "ws"
    assert choice([0, 32768], 16, 16, bwd_dh="fused") == "fused"


def test_plan_lists_fused_chains_longest_first():
    """CPPlan.fused_chains is bwd_fused's dispatch order: every piece once, (bos, eos, first chunk row, piece), longest
    first with ties in token order (one block per SM walks a whole piece, so the long walks start first)."""
    from qlabench.kernels.cp import build_plan

    plan = build_plan([0, 100, 100, 430, 470], 4, 16, "cpu")  # pieces 0-1: 64+36, 2: empty, 3-8: 5x64+10, 9: 40
    rows = plan.fused_chains.tolist()
    assert sorted(r[3] for r in rows) == list(range(plan.n_pieces))
    for bos, eos, cbase, j in rows:
        assert (bos, eos) == plan.pieces[j][:2] and cbase == plan.chunk_offsets[j].item()
    lengths = [-(-(eos - bos) // 16) for bos, eos, _, _ in rows]
    assert lengths == sorted(lengths, reverse=True)
    assert [r[3] for r in rows][:6] == [0, 3, 4, 5, 6, 7]  # the 4-chunk pieces in token order
    assert rows[-1][3] == 2  # the empty sequence's piece last


def test_plain_fused_chains_follow_the_dispatch_order():
    cu = torch.tensor([0, 10, 100, 100, 130], dtype=torch.int32)
    offsets = torch.tensor([0, 1, 7, 7, 9], dtype=torch.int32)
    got = backward.fused_chains(cu, offsets, torch.tensor([1, 3, 0, 2], dtype=torch.int32))
    assert got.dtype == torch.int32 and got.tolist() == [[10, 100, 1, 1], [100, 130, 7, 3], [0, 10, 0, 0],
                                                         [100, 100, 7, 2]]
