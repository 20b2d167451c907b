"""Intra-card CP backward (backward_cp.py) on the CPU, with the kernels' float64 twins.

``backward_cp._bwd_cp`` is the exact orchestration of ``chunk_gated_delta_rule_bwd_cp``; here it
launches ``emulate_bwd.KERNEL_TWINS`` (and ``emulate_fwd.TWIN_KERNELS`` for the piece initial states),
so in float64 the only differences from autograd of the float64 reference are rounding (exact mode,
decay_threshold None or no truncation possible) or the documented truncation error. Every case is
also compared with the non-CP backward: the float64 emulation of the five kernels
(``emulate_chunk_gated_delta_rule_bwd``) in float64, and ``backward._bwd_impl`` with the same twins
under the kernels' bf16 staging.
"""

from __future__ import annotations

import math
import types

import pytest
import torch
import torch.nn.functional as F

from qlabench.kernels import backward
from qlabench.kernels.backward_cp import BackwardCPKernels, _bwd_cp
from qlabench.kernels.cp import plan_cp
from qlabench.kernels.emulate_bwd import KERNEL_TWINS, emulate_chunk_gated_delta_rule_bwd
from qlabench.kernels.emulate_fwd import TWIN_KERNELS
from qlabench.kernels.forward_cp import ForwardKernels, _fwd_cp
from qlabench.kernels.reference import chunk_gated_delta_rule_ref, chunk_intermediates_ref
from qlabench.kernels.validate import validate

from .gdn_inputs import rel_l2

F64 = torch.float64
NAMES = ("dq", "dk", "dv", "dbeta", "dg", "dh0")
EXACT = 1e-8  # relative (to the largest entry of the reference gradient)


def _problem(T, h_qk, h_v, *, B=1, cu=None, D=16, C=8, gates=None, h0=False, dht=True, state_v_first=False,
             seed=0, dtype=F64):
    """Inputs (float64 or rounded to ``dtype``), autograd gradients of the float64 reference, and the
    backward's arguments. ``gates`` per v-head: "zero", "strong" (about -20 per token), "moderate"
    (logsigmoid / 8, the default), "slow" (about -0.15 per token)."""
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
            g[..., h] = -15 * F.softplus(0.5 * randn(B, T) + 1)
        elif kind == "slow":
            g[..., h] = F.logsigmoid(randn(B, T)) / 5
    if dtype != F64:
        q, k, v = (x.to(dtype).to(F64) for x in (q, k, v))
    N = B if cu is None else len(cu) - 1
    state = (N, h_v, D, D)
    h0_t = randn(*state) if h0 else None
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta)]
    h0_leaf = None if h0_t is None else h0_t.clone().requires_grad_(True)
    o, ht = chunk_gated_delta_rule_ref(*leaves, initial_state=h0_leaf, output_final_state=True, cu_seqlens=cu_t,
                                       state_v_first=state_v_first, chunk_size=C)
    do = randn(*o.shape)
    if dtype != F64:
        do = do.to(dtype).to(F64)
    dht_t = randn(*ht.shape) if dht else None
    loss = (o * do).sum() + ((ht * dht_t).sum() if dht else 0)
    grads = torch.autograd.grad(loss, leaves + ([h0_leaf] if h0 else []))
    want = dict(zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads))
    want.setdefault("dh0", None)
    inter = chunk_intermediates_ref(q, k, v, g, beta, initial_state=h0_t, cu_seqlens=cu_t,
                                    state_v_first=state_v_first, chunk_size=C)
    args = {"q": q, "k": k, "v": v, "g": g, "g_cumsum": inter.g_cumsum, "beta": beta, "A": inter.A, "do": do,
            "dht": dht_t, "initial_state": h0_t, "cu_seqlens": cu_t, "state_v_first": state_v_first, "C": C}
    if dtype != F64:  # as the kernels see them: q's dtype for q, k, v, do, A; fp32 gates and states
        for name in ("q", "k", "v", "do", "A"):
            args[name] = args[name].to(dtype)
        for name in ("g", "g_cumsum", "beta"):
            args[name] = args[name].float()
    return want, args


def _counting(calls: list, twins=KERNEL_TWINS):
    """The backward ``twins``, every launch appended to ``calls`` as (name, pieces or None, args)."""

    def wrap(name, fn):
        def launch(*a):
            n = {"bwd_h": a[4].numel() - 1, "bwd_dh": a[6].numel() - 1}.get(name)
            calls.append((name, n, a))
            return fn(*a)
        return launch

    bwd = {name: wrap(name, fn) for name, fn in twins.items()}

    def recurrence(n_blocks, sms, arch, bv=None):
        factory = TWIN_KERNELS["recurrence"](n_blocks, sms, arch)

        def make(*cfg):
            kernel = factory(*cfg)

            def launch(*a):
                calls.append(("fwd", a[6].numel() - 1, a))
                return kernel(*a)
            return launch
        return make

    def correct(*a, **kw):
        calls.append(("correct", a[5].shape[0] - 1, a))
        return TWIN_KERNELS["correct"](*a, **kw)

    return BackwardCPKernels(bwd, correct, ForwardKernels(TWIN_KERNELS["cumsum"], TWIN_KERNELS["kkt_solve"], recurrence,
                                                          correct))


def _run_cp(args, L, *, threshold=None, transition="auto", enable=True, states="recompute", calls=None,
            fwd_threshold="same", twins=KERNEL_TWINS):
    """The CP backward on the twins (``twins``: the backward's; default sm90's launch set). ``states``: "recompute" (h0_pieces None: the recompute's chain
    transitions serve the backward's chain), "forward" (h0_pieces and the chain's transitions from the
    CP forward with ``return_piece_states``; its threshold is ``fwd_threshold``) or "forward_h0" (the
    forward's h0_pieces only: the backward runs its own transition pass)."""
    C = args["C"]
    q, k, v, beta = args["q"], args["k"], args["v"], args["beta"]
    h0, cu, svf = args["initial_state"], args["cu_seqlens"], args["state_v_first"]
    p = validate(q, k, v, args["g_cumsum"], beta, None, h0, cu, svf)
    plan = plan_cp(cu, heads=p.h_v, sm_count=132, chunk_size=C, B=p.B, T=p.T, piece_chunks=L, enable=enable)
    arch = types.SimpleNamespace(name="sm90", chunk_size=C)
    h0_pieces = transitions = None
    if states in ("forward", "forward_h0"):
        fthr = threshold if fwd_threshold == "same" else fwd_threshold
        out = _fwd_cp(q, k, v, args["g"], beta, p, h0, cu, True, svf, plan, fthr, transition,
                      ForwardKernels(**TWIN_KERNELS), arch, 132, return_piece_states=True)
        h0_pieces, transitions = out[5], (out[6] if states == "forward" else None)
    kernels = _counting(calls if calls is not None else [], twins)
    got = _bwd_cp(p, q, k, v, args["g_cumsum"], beta, args["A"], args["do"], args["dht"], h0, cu, svf, plan,
                  threshold, transition, h0_pieces, kernels, arch, 132, transitions)
    return dict(zip(NAMES, got)), plan


def _non_cp(args):
    """The non-CP backward (the five kernels' float64 emulation)."""
    a = {n: args[n] for n in ("q", "k", "v", "g_cumsum", "beta", "A", "do", "dht", "initial_state", "cu_seqlens",
                              "state_v_first")}
    return dict(zip(NAMES, emulate_chunk_gated_delta_rule_bwd(**a, chunk_size=args["C"])))


def _assert_close(got, want, tol, what=""):
    for name in NAMES:
        if want[name] is None:
            assert got[name] is None, name
            continue
        assert got[name].shape == want[name].shape, name
        assert torch.isfinite(got[name]).all(), name
        err = (got[name] - want[name]).abs().max() / want[name].abs().max().clamp_min(1e-300)
        assert err <= tol, f"{what}{name}: relative max error {float(err):.3g} > {tol}"


def _check_exact(want, args, L, **kw):
    got, plan = _run_cp(args, L, **kw)
    _assert_close(got, want, EXACT, "vs reference autograd: ")
    _assert_close(got, _non_cp(args), EXACT, "vs non-CP backward: ")
    if args["cu_seqlens"] is not None:
        end = int(args["cu_seqlens"][-1])
        for name in ("dq", "dk", "dv", "dbeta", "dg"):
            assert (got[name].flatten(0, 1)[end:] == 0).all(), f"{name} not zero on the padding tail"
    return got, plan


@pytest.mark.parametrize("states", ["recompute", "forward", "forward_h0"])
def test_one_long_sequence_many_pieces_gqa_h0_dht(states):
    want, args = _problem(300, 1, 2, h0=True)  # 38 chunks of 8: 10 pieces of 4 chunks, partial last chunk
    calls = []
    _, plan = _check_exact(want, args, 4, states=states, calls=calls)
    assert plan.enabled and plan.n_pieces == 10
    dh_launches = [n for name, n, _ in calls if name == "bwd_dh"]
    # local pass (pieces 1..9), the transition pass only without the forward chain's M, final pass
    assert dh_launches == ([9, 9, 10] if states == "forward_h0" else [9, 10])
    assert [n for name, n, _ in calls if name == "bwd_h"] == [10]
    assert len([c for c in calls if c[0] == "fwd"]) == (2 if states == "recompute" else 0)


@pytest.mark.parametrize("states", ["recompute", "forward", "forward_h0"])
@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
def test_varlen_long_and_short_gqa(state_v_first, states):
    # long (4 pieces, partial last chunk), empty, shorter than a piece, 1 token, long (6 pieces), 1 token, tail
    cu = [0, 100, 100, 130, 131, 300, 301]
    want, args = _problem(320, 1, 4, cu=cu, h0=True, state_v_first=state_v_first, seed=1)
    _, plan = _check_exact(want, args, 4, states=states)
    assert plan.n_slots == 6 and len(plan.long_seqs) == 2


def test_dense_batch_two_pieces_no_h0():
    want, args = _problem(150, 2, 2, B=2, seed=2)  # 19 chunks: pieces of 16 + 3 chunks
    _check_exact(want, args, 16)


def test_no_dht_with_h0_and_no_h0_no_dht():
    want, args = _problem(200, 1, 2, h0=True, dht=False, seed=3)
    _check_exact(want, args, 4)
    want, args = _problem(200, 1, 2, dht=False, seed=4)
    got, _ = _check_exact(want, args, 4)
    assert got["dh0"] is None


@pytest.mark.parametrize("states", ["recompute", "forward"])
def test_strong_decay_truncates_and_skips_the_transition_pass(states):
    """g ~ -20 per token: every piece decays below e^-10, so M^T is dropped everywhere and the
    transition pass is skipped (dropped terms ~ e^-600: still exact)."""
    cu = [0, 250, 260, 400]
    want, args = _problem(400, 2, 4, cu=cu, gates=["strong"] * 4, h0=True, seed=5)
    calls = []
    _, plan = _check_exact(want, args, 4, threshold=-10.0, states=states, calls=calls)
    # 8 + 1 + 5 pieces; the local range is pieces 1..13
    assert [n for name, n, _ in calls if name == "bwd_dh"] == [13, 14]  # local pass and final pass only
    # the local pass stops after each middle piece's first chunk (the decay crosses e^-10 there), runs a
    # last piece whole (it carries dht) and no chunk of a first piece (its result is unused)
    local = next(a for name, _, a in calls if name == "bwd_dh")
    skip, has_skip = local[9], local[15]
    m = plan.bwd_fwd_valid.sum(-1)[:, None]
    middle, first = plan.bwd_trunc == 1, plan.bwd_skip_all > 0
    assert has_skip == 1 and first.any() and middle.any()
    assert torch.equal(skip[middle], (m - 1).expand_as(skip)[middle].to(skip.dtype))
    assert torch.equal(skip[first], m.expand_as(skip)[first].to(skip.dtype))
    assert (skip[~middle & ~first] == 0).all()
    final_skip = [a for name, _, a in calls if name == "bwd_dh"][-1]
    assert final_skip[15] == 0  # the final pass runs every chunk
    # the forward recompute skips its transition pass too: local + output (forward) or local only (here)
    assert len([c for c in calls if c[0] == "fwd"]) == (1 if states == "recompute" else 0)
    calls = []
    _check_exact(want, args, 4, threshold=-10.0, transition="always", states=states, calls=calls)
    # "always" runs the forward chain's transition pass (the recompute's here), never the backward's
    assert [n for name, n, _ in calls if name == "bwd_dh"] == [13, 14]
    assert len([c for c in calls if c[0] == "fwd"]) == (2 if states == "recompute" else 0)
    calls = []
    _check_exact(want, args, 4, threshold=-10.0, transition="always", states="forward_h0", calls=calls)
    assert [n for name, n, _ in calls if name == "bwd_dh"] == [13, 13, 14]


def test_mixed_heads_zero_gates_fall_back():
    """Zero-gate heads never decay: the transition pass runs and keeps their M^T exactly."""
    want, args = _problem(400, 2, 4, cu=[0, 250, 400], gates=["zero", "strong", "moderate", "strong"], h0=True,
                          state_v_first=True, seed=6)
    for states, n_dh in (("recompute", 2), ("forward", 2), ("forward_h0", 3)):
        calls = []
        _, plan = _check_exact(want, args, 4, threshold=-10.0, calls=calls, states=states)
        assert len([1 for name, _, _ in calls if name == "bwd_dh"]) == n_dh, states
        skip = next(a for name, _, a in calls if name == "bwd_dh")[9]  # the local pass's chunk_skip
        middle = plan.bwd_trunc == 1
        assert (skip[middle][:, 0] == 0).all() and (skip[middle][:, 1] > 0).all(), skip  # zero gate: whole


def test_plan_off_is_the_plain_backward():
    want, args = _problem(200, 1, 2, h0=True, seed=7)
    calls = []
    _, plan = _check_exact(want, args, 4, enable=False, calls=calls)
    assert not plan.enabled
    # bwd_dh is queued first (on the second stream, streams.Beside), bwd_h beside it
    assert [(name, n) for name, n, _ in calls] == [("bwd_prepare", None), ("bwd_dh", 1), ("bwd_h", 1),
                                                   ("bwd_chunk", None)]


def _exact_dh(args):
    """Exact chunk-end state gradients `[NT, H, K, V]` of the whole sequences (non-CP twins, float64)."""
    p = validate(args["q"], args["k"], args["v"], args["g_cumsum"], args["beta"], None, args["initial_state"],
                 args["cu_seqlens"], args["state_v_first"])
    C, BT, H = args["C"], p.B * p.T, p.h_v
    from qlabench.kernels.common.chunks import build_chunk_table, dense_cu_seqlens

    cu = dense_cu_seqlens(p.B, p.T, "cpu") if args["cu_seqlens"] is None else args["cu_seqlens"]
    table = build_chunk_table(cu, BT, C)
    q2, k2 = args["q"].reshape(BT, p.h_qk, p.K), args["k"].reshape(BT, p.h_qk, p.K)
    do2, g2 = args["do"].reshape(BT, H, p.V), args["g_cumsum"].reshape(BT, H)
    b2, A2 = args["beta"].reshape(BT, H), args["A"].reshape(BT, H, C)
    Pg, Ag = torch.zeros(BT, H, C, dtype=F64), torch.zeros(BT, H, C, dtype=F64)
    fac = torch.zeros(table.n_chunks_max, H, 3, C, dtype=F64)
    KERNEL_TWINS["bwd_prepare"](q2, k2, g2, b2, A2, table.chunk_bounds, Pg, Ag, fac, p.scale)
    dht = args["dht"].transpose(-1, -2) if args["state_v_first"] else args["dht"]
    dh = torch.zeros(table.n_chunks_max, H, p.K, p.V, dtype=F64)
    scratch = [torch.zeros(BT, H, p.V, dtype=F64)]  # dV' (sm90's bwd_dh stores no dv)
    no_skip = torch.zeros(1, H, dtype=torch.int32)
    KERNEL_TWINS["bwd_dh"](q2, k2, do2, Pg, Ag, fac, table.cu_seqlens, table.chunk_offsets, table.seq_order, no_skip,
                           dht, dh, *scratch, torch.zeros(p.N, H, p.K, p.V, dtype=F64), p.scale, 0)
    return dh


def test_truncation_error_within_bound():
    """threshold -2 (exact piece initial states): a visible error in the pieces' terminal gradients and
    dh0, within e^threshold * max ||exact chunk-end gradient||_2 of the sequence; zero-gate head exact."""
    threshold = -2.0
    cu = [0, 260, 400]
    want, args = _problem(400, 1, 3, cu=cu, gates=["slow", "slow", "zero"], h0=True, seed=8)
    calls = []
    got, plan = _run_cp(args, 4, threshold=threshold, states="forward_h0", fwd_threshold=None, calls=calls)
    dh = _exact_dh(args)
    off = plan.chunk_offsets.tolist()
    seq = plan.piece_seq.tolist()
    chunk_seq = torch.repeat_interleave(torch.arange(2), torch.tensor([math.ceil(260 / 8), math.ceil(140 / 8)]))
    norms = torch.linalg.matrix_norm(dh[: off[-1]], ord=2)  # [NT, H]
    bound = torch.stack([norms[chunk_seq == n].amax(0) for n in range(2)]) * math.exp(threshold)  # [N, H]
    dht_pieces = [a for name, _, a in calls if name == "bwd_dh"][-1][10]  # the final pass's terminal gradients
    exact_end = dh[torch.tensor(off[1:]) - 1]  # gradient at each piece's end
    err = torch.linalg.matrix_norm(dht_pieces - exact_end, ord=2)  # [P, H]
    assert err.max() > 1e-6, "no truncation happened: the test does not test anything"
    assert torch.all(err <= bound[torch.tensor(seq)] * (1 + 1e-9) + 1e-12)
    assert err[:, 2].max() <= 1e-10  # zero-gate head: exact fallback
    err_dh0 = torch.linalg.matrix_norm(got["dh0"] - want["dh0"], ord=2)  # [N, H]
    assert err_dh0.max() > 1e-6 and torch.all(err_dh0 <= bound * (1 + 1e-9) + 1e-12)
    # the last piece of each sequence is never truncated
    last = plan.last_piece.tolist()
    assert err[last].max() <= 1e-10


@pytest.mark.parametrize("case", ["varlen-h0", "dense-qwen-vk"])
def test_bf16_staging_matches_the_plain_backward(case, monkeypatch):
    """With the kernels' bf16 staging (the twins stage in the buffers' dtype) the CP backward stays
    within the GPU tests' budget of the reference and close to the plain backward (same twins)."""
    if case == "varlen-h0":
        want, args = _problem(300, 1, 2, cu=[0, 230, 240, 290], D=32, C=16, h0=True, seed=9,
                              dtype=torch.bfloat16)
    else:
        want, args = _problem(256, 1, 2, D=32, C=16, h0=True, gates=["strong", "moderate"],
                              state_v_first=True, seed=10, dtype=torch.bfloat16)
    got, plan = _run_cp(args, 2, threshold=-10.0)
    assert plan.enabled
    p = validate(args["q"], args["k"], args["v"], args["g_cumsum"], args["beta"], None, args["initial_state"],
                 args["cu_seqlens"], args["state_v_first"])
    plain = dict(zip(NAMES, backward._bwd_impl(
        p, args["q"], args["k"], args["v"], args["g_cumsum"], args["beta"], args["A"], args["do"], args["dht"],
        args["initial_state"], args["cu_seqlens"], args["state_v_first"], args["C"], KERNEL_TWINS)))
    for name in NAMES:
        assert got[name].dtype == plain[name].dtype, name
        e_ref, e_plain = rel_l2(got[name], want[name]), rel_l2(got[name], plain[name])
        assert e_ref <= 0.02, f"{name}: rel-L2 {e_ref:.3g} vs the reference"
        assert e_plain <= 0.02, f"{name}: rel-L2 {e_plain:.3g} vs the plain backward"


def test_bad_arguments_are_named():
    _, args = _problem(64, 1, 2, h0=True)
    with pytest.raises(ValueError, match="transition"):
        _run_cp(args, 4, transition="never")
    with pytest.raises(ValueError, match="decay_threshold"):
        _run_cp(args, 4, threshold=1.0)
    p = validate(args["q"], args["k"], args["v"], args["g_cumsum"], args["beta"], None, args["initial_state"])
    plan = plan_cp(None, heads=2, sm_count=132, chunk_size=8, B=1, T=64, piece_chunks=2, enable=True)
    arch = types.SimpleNamespace(name="sm90", chunk_size=8)
    a = (p, args["q"], args["k"], args["v"], args["g_cumsum"], args["beta"], args["A"], args["do"], args["dht"],
         args["initial_state"], None, False, plan, None, "auto")
    with pytest.raises(ValueError, match="h0_pieces must have shape"):
        _bwd_cp(*a, torch.zeros(3, 2, 16, 16, dtype=F64), BackwardCPKernels(KERNEL_TWINS, TWIN_KERNELS["correct"]), arch, 132)
    with pytest.raises(ValueError, match="no forward kernels"):
        _bwd_cp(*a, None, BackwardCPKernels(KERNEL_TWINS, TWIN_KERNELS["correct"]), arch, 132)
    other = plan_cp(torch.tensor([0, 32, 64]), heads=2, sm_count=132, chunk_size=8)
    with pytest.raises(ValueError, match="plan is for"):
        _bwd_cp(*a[:12], other, None, "auto", None, BackwardCPKernels(KERNEL_TWINS, TWIN_KERNELS["correct"]), arch, 132)


@pytest.mark.parametrize("cu,L", [([0, 8192, 8192 + 3000, 8192 + 3000 + 20480], 8), ([0, 100, 12345], 16)])
def test_bwd_m_rows_point_at_the_forward_chain_rows(cu, L):
    """plan.bwd_m_rows: each row of the backward's local range that enters its chain (a middle piece) reads
    the forward chain's row of the same piece; every other row (first and last pieces, the zero row) the
    forward's zero-flag row P1."""
    from qlabench.kernels.cp import build_plan

    plan = build_plan(cu, L, 64, torch.device("cpu"))
    lo, hi = plan.bwd_pass
    p1_lo, p1_hi = plan.pass1
    rows = plan.bwd_m_rows.tolist()
    assert len(rows) == hi - lo + 1 and rows[-1] == p1_hi - p1_lo
    seq = [p[2] for p in plan.pieces]
    for r, j in enumerate(range(lo, hi)):
        middle = 0 < j < len(seq) - 1 and seq[j - 1] == seq[j] == seq[j + 1]
        assert rows[r] == (j - p1_lo if middle else p1_hi - p1_lo), (r, j)
    assert plan.bwd_needs_m.tolist() == [x != p1_hi - p1_lo for x in rows[:-1]]
    assert torch.equal(plan.bwd_slot_src32, plan.bwd_slot_src.to(torch.int32))
    assert plan.bwd_slot_msrc32.dtype == torch.int32
    assert plan.bwd_slot_msrc32.tolist() == [[rows[j] for j in step] for step in plan.bwd_slot_src.tolist()]


@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
def test_chain_reads_the_forward_transitions_through_msrc(state_v_first):
    """The correction chain (its float64 twin) on the forward's stored transitions through msrc (m_rows[src]), read
    transposed (transpose_m = not state_v_first), equals the chain on the explicitly gathered M^T with
    the flags masked by the rows that enter (what PieceTransitions.adjoint built before); the (hi, lo)
    pair form is read as hi + lo."""
    from qlabench.kernels.emulate_fwd import twin_cp_correct

    gen = torch.Generator().manual_seed(11)
    n, H, K, n_src, n_out = 6, 3, 4, 5, 6
    M = torch.randn(n + 1, H, K, K, generator=gen, dtype=torch.float64)
    flag = (torch.rand(n + 1, H, generator=gen) < 0.7).to(torch.int32)
    flag[n] = 0
    M[flag == 0] = float("nan")  # never read
    m_rows = torch.tensor([2, n, 0, 5, n], dtype=torch.int32)  # last row: the zero row
    init = torch.randn(1, H, K, K, generator=gen, dtype=torch.float64)
    L = torch.randn(n_src, H, K, K, generator=gen, dtype=torch.float64)
    L[-1] = 0
    src = torch.tensor([[0], [3], [1], [2], [4]], dtype=torch.int32)
    r = m_rows.long()
    Mt = M[r] if state_v_first else M[r].transpose(-1, -2)
    want = twin_cp_correct(init, L, Mt.contiguous(), flag[r], src, torch.empty(n_out, 1, H, K, K, dtype=torch.float64),
                           "cpu")
    msrc = m_rows[src.long()]
    got = twin_cp_correct(init, L, M, flag, src, torch.empty_like(want), "cpu", msrc=msrc,
                          transpose_m=not state_v_first)
    assert torch.equal(got, want)
    hi = M.float().to(torch.float64)
    pair = twin_cp_correct(init, L, (hi, M - hi), flag, src, torch.empty_like(want), "cpu", msrc=msrc,
                           transpose_m=not state_v_first)
    assert torch.allclose(pair, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cu", [[0, 100, 100, 430, 470], [0, 300, 301, 700, 1000]])
def test_chain_rows_are_the_pieces_rows(cu):
    """cp_correct writes the chain straight into per-piece tables: output s of long sequence l goes to row
    slot_rows32[s, l] (forward: the start state of the sequence's piece s) and bwd_slot_rows32[s, l] (backward: the end
    gradient of its piece last - 1 - s), the pieces taken from plan.pieces here; every other entry is the scratch row
    P; and the rows the chain does not write are exactly each sequence's first (forward) / last (backward) piece,
    which the callers fill from the user's h0 / dht."""
    from qlabench.kernels.cp import build_plan

    plan = build_plan(cu, 4, 16, "cpu")
    P, nl = plan.n_pieces, len(plan.long_seqs)
    assert nl >= 2 and plan.enabled
    of_seq = [[j for j, piece in enumerate(plan.pieces) if piece[2] == n] for n in plan.long_seqs]
    fwd_piece = {(s, l_idx): js[s] for l_idx, js in enumerate(of_seq) for s in range(len(js))}
    bwd_piece = {(s, l_idx): js[-2 - s] for l_idx, js in enumerate(of_seq) for s in range(len(js) - 1)}
    for rows, want, firsts in ((plan.slot_rows32, fwd_piece, plan.first_piece),
                               (plan.bwd_slot_rows32, bwd_piece, plan.last_piece)):
        for s in range(rows.shape[0]):
            for l_idx in range(nl):
                assert rows[s, l_idx].item() == want.get((s, l_idx), P), (s, l_idx)
        written = {r for r in rows.flatten().tolist() if r != P}
        users = set(firsts.tolist())
        if rows is plan.slot_rows32:  # output 0 of the forward chain is the user's h0 again: written both ways
            assert written | users == set(range(P)) and written & users == {plan.first_piece[n].item()
                                                                            for n in plan.long_seqs}
        else:
            assert written | users == set(range(P)) and not written & users


@pytest.mark.parametrize("cu", [[0, 1000], [0, 100, 100, 430, 470], [0, 300, 301, 700, 1000], [0, 5, 9, 12]])
def test_first_rows_is_the_first_piece_gather(cu):
    """CPPlan.first_rows(x) equals x[first_piece]; a view of x (no launch) when the first pieces are consecutive rows
    (one sequence; one piece per sequence)."""
    from qlabench.kernels.cp import build_plan

    plan = build_plan(cu, 4, 16, "cpu")
    x = torch.randn(plan.n_pieces, 3)
    got = plan.first_rows(x)
    assert torch.equal(got, x[plan.first_piece])
    firsts = plan.first_piece.tolist()
    consecutive = firsts == list(range(firsts[0], firsts[0] + len(firsts)))
    assert (got.data_ptr() == x[firsts[0]].data_ptr()) == consecutive
    if len(cu) == 2 or not plan.enabled:
        assert consecutive
