"""Intra-card CP on the CPU: the plan (cp.py) and the CP forward's orchestration (forward_cp.py).

The orchestration runs with float64 twins of the three forward kernels (emulate_fwd.py), so the
only differences from the float64 reference are rounding (exact mode) or the documented
truncation error (decay_threshold on).
"""

from __future__ import annotations

import itertools
import math
import random
import types

import pytest
import torch
import torch.nn.functional as F

from qlabench.kernels import cp
from qlabench.kernels.cp import build_plan, choose_piece_chunks, plan_cp
from qlabench.kernels.emulate_fwd import TWIN_KERNELS
from qlabench.kernels.forward_cp import ForwardKernels, _fwd_cp
from qlabench.kernels.reference import chunk_gated_delta_rule_ref, chunk_intermediates_ref
from qlabench.kernels.validate import validate

F64 = torch.float64
EXACT = 1e-10


# ---------------------------------------------------------------------------------------- plan


def _cu(lengths, start=0):
    return list(itertools.accumulate(lengths, initial=start))


@pytest.mark.parametrize("seed", range(6))
def test_plan_covers_every_token_chunk_aligned(seed):
    rng = random.Random(seed)
    C = rng.choice([16, 32, 64])
    L = rng.choice([1, 2, 4, 8])
    lengths = [rng.choice([0, 1, C - 1, C, C + 1, rng.randint(1, 40 * C)]) for _ in range(rng.randint(1, 12))]
    cu = _cu(lengths)
    plan = build_plan(cu, L, C, "cpu")
    pieces = plan.pieces
    assert plan.cu_pieces.tolist() == [0] + [p[1] for p in pieces]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces)), "pieces must tile the token axis"
    assert pieces[-1][1] == cu[-1]
    offsets = [0]
    for n, (bos, eos) in enumerate(itertools.pairwise(cu)):
        mine = [p for p in pieces if p[2] == n]
        nc = -(-(eos - bos) // C)
        assert len(mine) == (-(-nc // L) if nc > L else 1)
        assert mine[0][0] == bos and mine[-1][1] == eos
        for j, (a, b, _) in enumerate(mine):
            assert (a - bos) % (L * C) == 0, "piece start not chunk aligned in its sequence"
            assert b - a <= L * C or len(mine) == 1
            offsets.append(offsets[-1] + -(-(b - a) // C))
        assert plan.is_first.tolist()[pieces.index(mine[0])] and plan.is_last.tolist()[pieces.index(mine[-1])]
        assert plan.last_piece.tolist()[n] == pieces.index(mine[-1])
    assert plan.chunk_offsets.tolist() == offsets
    assert plan.piece_seq.tolist() == [p[2] for p in pieces]
    assert sum(plan.is_first.tolist()) == sum(plan.is_last.tolist()) == len(lengths)
    # Every piece that is not last in its sequence lies in the local pass's range.
    non_last = [j for j, last in enumerate(plan.is_last.tolist()) if not last]
    if non_last:
        lo, hi = plan.pass1
        assert lo == non_last[0] and hi == non_last[-1] + 1
        assert plan.pass1_cu.tolist() == plan.cu_pieces.tolist()[lo:hi + 1]
    else:
        assert plan.pass1 is None and not plan.enabled


def test_plan_off_is_the_sequences():
    cu = [0, 100, 100, 5000]
    plan = build_plan(cu, None, 64, "cpu")
    assert not plan.enabled and plan.pass1 is None
    assert plan.cu_pieces.tolist() == cu and plan.h0_src.tolist() == [0, 1, 2]


@pytest.mark.parametrize("heads,on,L", [(8, True, 16), (16, True, 32), (32, True, 32), (48, True, 32),
                                        (64, False, 64)])
def test_choose_h200_32k_matches_flashqla_examples(heads, on, L):
    """flashqla-design.md 4.2's H200 examples (132 SMs, one 32k sequence = 512 chunks)."""
    assert choose_piece_chunks([32768], heads, 132, 64) == (on, L)


def test_choose_thresholds():
    # Many long sequences fill the GPU: off. One short sequence: nothing to cut.
    assert not choose_piece_chunks([32768] * 8, 8, 132, 64)[0]
    assert not choose_piece_chunks([200], 1, 132, 64)[0]
    # 56-chain threshold needs >= 128 chunks in the longest sequence.
    assert not choose_piece_chunks([127 * 64] * 1, 50, 132, 64)[0]
    assert choose_piece_chunks([128 * 64] * 1, 50, 132, 64)[0]
    # Effective batch: one long sequence plus short ones counts the short ones' share.
    on, L = choose_piece_chunks([32768] + [64] * 64, 4, 132, 64)
    assert on and L >= 4
    # L is a power of two >= 4 and grows like sqrt(heads).
    for heads in (1, 2, 4, 8, 16, 32, 64, 128):
        L = choose_piece_chunks([65536], heads, 132, 64)[1]
        assert L >= 4 and L & (L - 1) == 0
    assert choose_piece_chunks([1 << 20], 64, 132, 64)[1] > choose_piece_chunks([1 << 20], 4, 132, 64)[1]
    # More SMs -> shorter pieces.
    assert choose_piece_chunks([65536], 16, 264, 64)[1] <= choose_piece_chunks([65536], 16, 132, 64)[1]
    with pytest.raises(ValueError):
        choose_piece_chunks([64], 0, 132, 64)


def test_plan_heads_makes_the_split_independent_of_sharding():
    cu = torch.tensor([0, 20000, 32768], dtype=torch.int32)
    full = plan_cp(cu, heads=16, sm_count=132, chunk_size=64)
    # A rank holding 4 of the 16 heads plans with the global count: same split.
    shard = plan_cp(cu, heads=16, sm_count=132, chunk_size=64)
    assert shard.pieces == full.pieces and full.enabled
    # Planning with the local count would cut differently (upstream's behaviour).
    local = plan_cp(cu, heads=4, sm_count=132, chunk_size=64)
    assert local.pieces != full.pieces


def test_plan_cache_and_capture(monkeypatch):
    cu = torch.tensor([0, 4096], dtype=torch.int32)
    a = plan_cp(cu, heads=2, sm_count=132, chunk_size=64)
    assert plan_cp(cu, heads=2, sm_count=132, chunk_size=64) is a
    dense = plan_cp(None, heads=2, sm_count=132, chunk_size=64, B=1, T=4096)
    assert dense.pieces == a.pieces
    monkeypatch.setattr(cp, "_capturing", lambda device: True)
    assert plan_cp(cu, heads=2, sm_count=132, chunk_size=64) is a  # cached: no host work
    with pytest.raises(RuntimeError, match="capture"):
        plan_cp(cu, heads=3, sm_count=132, chunk_size=64)


# ------------------------------------------------------------------------------- orchestration


def _inputs(T, h_qk, h_v, *, B=1, D=16, gates=None, h0_n=None, state_v_first=False, seed=0):
    """Float64 inputs, l2-normalised q/k, beta in (0, 1). ``gates`` per v-head: "zero" (g = 0),
    "strong" (about -2 per token), anything else moderate (logsigmoid / 8)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64)

    q = F.normalize(randn(B, T, h_qk, D), dim=-1)
    k = F.normalize(randn(B, T, h_qk, D), dim=-1)
    v = randn(B, T, h_v, D)
    beta = torch.sigmoid(randn(B, T, h_v))
    g = F.logsigmoid(randn(B, T, h_v)) / 8
    for h, kind in enumerate(gates or ()):
        if kind == "zero":
            g[..., h] = 0
        elif kind == "strong":
            g[..., h] = -2 * F.softplus(randn(B, T) + 1)
    h0 = None if h0_n is None else randn(h0_n, h_v, D, D)
    return q, k, v, g, beta, h0


def _run(q, k, v, g, beta, h0, cu, C, L, *, state_v_first=False, threshold=None, transition="auto",
         enable=True, kernels=None, final=True):
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    p = validate(q, k, v, g, beta, None, h0, cu_t, state_v_first)
    plan = plan_cp(cu_t, heads=p.h_v, sm_count=132, chunk_size=C, B=p.B, T=p.T, piece_chunks=L, enable=enable)
    arch = types.SimpleNamespace(name="sm90", chunk_size=C)
    kernels = kernels or ForwardKernels(**TWIN_KERNELS)
    out = _fwd_cp(q, k, v, g, beta, p, h0, cu_t, final, state_v_first, plan, threshold, transition, kernels,
                  arch, 132)
    return out, plan


def _counting_kernels(calls: list):
    """The twins, with every recurrence launch appended to ``calls``."""

    def recurrence(n_blocks, sms, arch):
        twin_factory = TWIN_KERNELS["recurrence"](n_blocks, sms, arch)

        def factory(*cfg):
            kernel = twin_factory(*cfg)

            def launch(*args):
                calls.append(args[6].numel() - 1)  # pieces in the launch
                return kernel(*args)
            return launch
        return factory

    return ForwardKernels(TWIN_KERNELS["cumsum"], TWIN_KERNELS["kkt_solve"], recurrence)


def _check_exact(q, k, v, g, beta, h0, cu, C, L, state_v_first=False, threshold=None):
    (gc, A, o, h, ht), plan = _run(q, k, v, g, beta, h0, cu, C, L, state_v_first=state_v_first,
                                threshold=threshold)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    ref = chunk_intermediates_ref(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu_t,
                                  state_v_first=state_v_first, chunk_size=C)
    end = cu[-1] if cu is not None else o.shape[0] * o.shape[1]

    def flat(x):
        return x.reshape(-1, *x.shape[2:])[:end]

    assert h is None
    assert (o - ref.o).abs().max() <= EXACT
    assert (ht - ref.final_state).abs().max() <= EXACT
    assert (flat(gc) - flat(ref.g_cumsum)).abs().max() <= EXACT
    assert (flat(A) - flat(ref.A)).abs().max() <= EXACT
    if cu is not None:
        assert torch.all(o.reshape(-1, *o.shape[2:])[end:] == 0), "padding tail of o not zero"
    return plan


def test_exact_single_sequence_with_h0():
    plan = _check_exact(*_inputs(300, 1, 2, h0_n=1), None, 8, 4)
    assert plan.enabled and plan.n_pieces == 10


def test_exact_dense_batch():
    _check_exact(*_inputs(150, 2, 2, B=2, h0_n=2), None, 8, 2)


@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
def test_exact_varlen_short_empty_tail_gqa(state_v_first):
    cu = [0, 100, 100, 130, 131, 300, 301]  # long, empty, shorter than a piece, 1 token, long, 1 token
    plan = _check_exact(*_inputs(320, 1, 4, h0_n=6, state_v_first=state_v_first), cu, 8, 4,
                        state_v_first=state_v_first)
    assert plan.pass1_wasted > 0  # short sequences between long ones run in the local pass too


def test_exact_with_strong_and_zero_gate_heads():
    """Strong-decay heads are truncated (dropped terms ~ e^-60), zero-gate heads fall back to M."""
    gates = ["zero", "strong", "moderate", "strong"]
    q, k, v, g, beta, h0 = _inputs(400, 2, 4, gates=gates, h0_n=2)
    cu = [0, 250, 400]
    calls = []
    kernels = _counting_kernels(calls)
    _check_exact(q, k, v, g, beta, h0, cu, 8, 4, threshold=-10.0)
    (_, _, o, _, ht), _ = _run(q, k, v, g, beta, h0, cu, 8, 4, threshold=-10.0, kernels=kernels)
    assert len(calls) == 3  # local pass, transition pass (zero-gate heads need M), output pass
    ref_o, ref_s = chunk_gated_delta_rule_ref(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                              cu_seqlens=torch.tensor(cu), chunk_size=8)
    assert (o - ref_o).abs().max() <= EXACT and (ht - ref_s).abs().max() <= EXACT


def test_transition_pass_skipped_when_every_head_decays():
    q, k, v, g, beta, h0 = _inputs(300, 1, 2, gates=["strong", "strong"], h0_n=1)
    for transition, launches in (("auto", 2), ("always", 3)):
        calls = []
        kernels = _counting_kernels(calls)
        (_, _, o, _, ht), _ = _run(q, k, v, g, beta, h0, None, 8, 4, threshold=-10.0, transition=transition,
                                   kernels=kernels)
        assert len(calls) == launches
        ref_o, ref_s = chunk_gated_delta_rule_ref(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                  chunk_size=8)
        assert (o - ref_o).abs().max() <= EXACT and (ht - ref_s).abs().max() <= EXACT


def test_plan_off_runs_one_recurrence():
    q, k, v, g, beta, h0 = _inputs(200, 1, 2, h0_n=1)
    calls = []
    kernels = _counting_kernels(calls)
    (_, _, o, _, ht), plan = _run(q, k, v, g, beta, h0, None, 8, 4, enable=False, kernels=kernels)
    assert not plan.enabled and len(calls) == 1
    ref_o, ref_s = chunk_gated_delta_rule_ref(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                              chunk_size=8)
    assert (o - ref_o).abs().max() <= EXACT and (ht - ref_s).abs().max() <= EXACT


def test_no_final_state():
    q, k, v, g, beta, h0 = _inputs(120, 1, 2)
    (_, _, o, _, ht), _ = _run(q, k, v, g, beta, h0, None, 8, 4, final=False)
    ref_o, _ = chunk_gated_delta_rule_ref(q, k, v, g, beta, chunk_size=8)
    assert ht is None and (o - ref_o).abs().max() <= EXACT


def test_head_sharded_calls_match_the_unsharded_call():
    """With one plan (global head count) two 2-head shards reproduce the 4-head call per head."""
    q, k, v, g, beta, h0 = _inputs(300, 2, 4, gates=["zero", "strong", "moderate", "strong"], h0_n=1)
    (_, _, o, _, ht), _ = _run(q, k, v, g, beta, h0, None, 8, 4, threshold=-3.0)
    for s in range(2):
        heads = slice(2 * s, 2 * s + 2)
        (_, _, o_s, _, ht_s), _ = _run(q[:, :, s:s + 1], k[:, :, s:s + 1], v[:, :, heads], g[..., heads],
                                       beta[..., heads], h0[:, heads], None, 8, 4, threshold=-3.0)
        assert (o_s - o[:, :, heads]).abs().max() <= 1e-12
        assert (ht_s - ht[:, heads]).abs().max() <= 1e-12


@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
def test_truncation_error_within_bound(state_v_first):
    """threshold -2: truncation makes a visible error, within e^threshold max_i ||S_in(i)||_2."""
    threshold = -2.0
    q, k, v, g, beta, h0 = _inputs(400, 1, 3, gates=["moderate", "moderate", "zero"], h0_n=2)
    g = g * 1.5
    cu = [0, 260, 400]
    (_, _, o, _, ht), _ = _run(q, k, v, g, beta, h0, cu, 8, 4, state_v_first=state_v_first,
                               threshold=threshold)
    cu_t = torch.tensor(cu)
    ref = chunk_intermediates_ref(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu_t,
                                  state_v_first=state_v_first, chunk_size=8)
    # max over each sequence's chunk-start states (a superset of its piece starts) per head.
    chunk_seq = torch.repeat_interleave(torch.arange(2), torch.tensor([math.ceil(260 / 8), math.ceil(140 / 8)]))
    norms = torch.linalg.matrix_norm(ref.h, ord=2)  # [NT, H]
    bound = torch.stack([norms[chunk_seq == n].amax(0) for n in range(2)]) * math.exp(threshold)  # [N, H]
    err_final = torch.linalg.matrix_norm(ht - ref.final_state, ord=2)
    assert err_final.max() > 1e-6, "no truncation happened: the test does not test anything"
    assert torch.all(err_final <= bound * (1 + 1e-9))
    assert err_final[:, 2].max() <= EXACT  # zero-gate head: exact fallback
    seq_of_token = torch.repeat_interleave(torch.arange(2), torch.tensor([260, 140]))
    err_o = (o - ref.o)[0].norm(dim=-1)  # [T, H]; ||q_t|| = 1
    scale = 16 ** -0.5
    assert torch.all(err_o <= scale * bound[seq_of_token] * (1 + 1e-9) + 1e-12)


def test_bad_arguments_are_named():
    q, k, v, g, beta, h0 = _inputs(64, 1, 2)
    with pytest.raises(ValueError, match="transition"):
        _run(q, k, v, g, beta, h0, None, 8, 4, transition="never")
    with pytest.raises(ValueError, match="decay_threshold"):
        _run(q, k, v, g, beta, h0, None, 8, 4, threshold=1.0)
    p = validate(q, k, v, g, beta)
    other = plan_cp(torch.tensor([0, 32, 64]), heads=2, sm_count=132, chunk_size=8)
    arch = types.SimpleNamespace(name="sm90", chunk_size=8)
    with pytest.raises(ValueError, match="plan is for"):
        _fwd_cp(q, k, v, g, beta, p, None, None, True, False, other, None, "auto",
                ForwardKernels(**TWIN_KERNELS), arch, 132)
