"""Intra-card CP forward (forward_cp.py) on the GPU: against the plain forward and the float64 reference.

Every case runs CP three ways: with the plan the model chooses (often off on small cases), forced on
with short pieces (4 chunks: many pieces, long chains of corrections), and forced on exactly
(decay_threshold None). Tolerances as tests/kernels/test_forward_gpu.py (relative L2 <= 0.02 against
the reference); against the plain forward the budget is the same (both stage in bf16).
"""

from __future__ import annotations

import pytest
import torch

from qlabench.kernels.reference import chunk_gated_delta_rule_ref

from .gdn_inputs import make_inputs, poison_cuda_cache, random_varlen, rel_l2

pytestmark = pytest.mark.gpu
TOL = 0.02
MODES = {"model": {}, "forced4": {"piece_chunks": 4, "enable": True},
         "forced16_exact": {"piece_chunks": 16, "enable": True, "exact": True}}


def _check_cp(inp, modes=MODES):
    from qlabench.kernels.cp import plan_cp
    from qlabench.kernels.dispatch import arch_for_device
    from qlabench.kernels.forward import _sm_count, chunk_gated_delta_rule_fwd
    from qlabench.kernels.forward_cp import chunk_gated_delta_rule_fwd_cp

    x = {key: inp.get(key) for key in ("q", "k", "v", "g", "beta")}
    h0, cu, vf = inp.get("initial_state"), inp.get("cu_seqlens"), inp["state_v_first"]
    ref_o, ref_s = chunk_gated_delta_rule_ref(**x, initial_state=h0, cu_seqlens=cu, state_v_first=vf,
                                              output_final_state=True)
    gc_plain, A_plain, o_plain, _, s_plain = chunk_gated_delta_rule_fwd(**x, initial_state=h0, cu_seqlens=cu,
                                                           state_v_first=vf)
    B, T, H = inp["v"].shape[:3]
    arch = arch_for_device(inp["q"].device)
    results = {}
    for name, opts in modes.items():
        opts = dict(opts)
        exact = opts.pop("exact", False)
        plan = plan_cp(cu, heads=H, sm_count=_sm_count(inp["q"].device), chunk_size=arch.chunk_size, B=B, T=T,
                       device=inp["q"].device, **opts)
        poison_cuda_cache()
        gc, A, o, h, s = chunk_gated_delta_rule_fwd_cp(**x, initial_state=h0, cu_seqlens=cu, state_v_first=vf,
                                                       plan=plan, decay_threshold=None if exact else -10.0)
        errs = {"o_ref": rel_l2(o, ref_o), "s_ref": rel_l2(s, ref_s), "o_plain": rel_l2(o, o_plain),
                "s_plain": rel_l2(s, s_plain)}
        assert h is None

        def flat(t, end=int(cu[-1]) if cu is not None else B * T):
            return t.reshape(-1, *t.shape[2:])[:end]

        # Same cumsum and kkt_solve launches as the plain forward on the same inputs: bitwise equal.
        assert torch.equal(flat(gc), flat(gc_plain)) and torch.equal(flat(A), flat(A_plain)), name
        assert torch.all(o.reshape(-1, *o.shape[2:])[flat(o).shape[0]:] == 0), f"{name}: padding tail not zero"
        bad = {key: val for key, val in errs.items() if not val <= TOL}
        assert not bad, f"{name} (pieces {plan.n_pieces}, enabled {plan.enabled}): over {TOL}: {bad} ({errs})"
        results[name] = errs
    return results


@pytest.mark.parametrize("h_qk,h_v", [(4, 4), (2, 8), (4, 16)], ids=["H4-HV4", "H2-HV8", "H4-HV16"])
@pytest.mark.parametrize("gate", ["bench", "qwen"])
def test_cp_dense_T4096(h_qk, h_v, gate):
    _check_cp(make_inputs(4096, h_qk, h_v, gate=gate))


@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
@pytest.mark.parametrize("gate", ["bench", "qwen"])
def test_cp_dense_batch_h0(state_v_first, gate):
    _check_cp(make_inputs(1000, 2, 4, B=3, gate=gate, h0=True, state_v_first=state_v_first))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gate", ["bench", "qwen"])
def test_cp_random_varlen_with_tail(seed, gate):
    cu, T = random_varlen(seed)
    _check_cp(make_inputs(T, 2, 4, cu_seqlens=cu, gate=gate, h0=seed % 2 == 0, state_v_first=seed == 1))


def test_cp_irregular_cu_seqlens_16_32():
    _check_cp(make_inputs(4096, 16, 32, cu_seqlens=[0, 410, 841, 1135, 2126, 2512, 4096], gate="qwen", h0=True))


def test_cp_empty_sequence_and_tail():
    _check_cp(make_inputs(300, 1, 2, cu_seqlens=[0, 100, 100, 229], h0=True))


@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
def test_cp_long_T32768_h0(state_v_first):
    _check_cp(make_inputs(32768, 2, 4, gate="qwen", h0=True, state_v_first=state_v_first))


@pytest.mark.parametrize("h_qk,h_v", [(16, 16), (2, 8)], ids=["hk16_hv16", "hk2_hv8"])
@pytest.mark.parametrize("gate", ["bench", "qwen"])
def test_cp_1x32768(h_qk, h_v, gate):
    """The case CP is for: the model's plan must turn CP on here."""
    from qlabench.kernels.cp import plan_cp
    from qlabench.kernels.forward import _sm_count

    inp = make_inputs(32768, h_qk, h_v, gate=gate, h0=True)
    plan = plan_cp(None, heads=h_v, sm_count=_sm_count(inp["q"].device), chunk_size=64, B=1, T=32768,
                   device=inp["q"].device)
    assert plan.enabled, "CP should turn on for one 32k sequence with few heads"
    _check_cp(inp)
    # the warm-up truncation is in effect: decaying heads run a few chunks, zero-gate heads fall back
    from qlabench.kernels.common.chunks import build_chunk_table
    from qlabench.kernels.common.cumsum import chunk_local_cumsum
    from qlabench.kernels.dispatch import arch_for_device
    from qlabench.kernels.forward_cp import warmup_skips

    table = build_chunk_table(torch.tensor([0, 32768], dtype=torch.int32, device="cuda"), 32768, 64)
    gc = chunk_local_cumsum(inp["g"][0].contiguous(), table, 64, arch_for_device(inp["q"].device).name)
    skip_local, _, fallback = warmup_skips(plan, gc, -10.0)
    zero = (inp["g"][0] == 0).all(0)
    assert torch.equal(fallback[:, zero], torch.ones_like(fallback[:, zero]))
    if gate == "bench":
        warm = plan.piece_chunks - skip_local[:, ~zero]
        assert warm.max() <= 6 and not fallback[:, ~zero].any(), warm


@pytest.mark.parametrize("variant", ["chunk_fwd", "chunk_fwd_pipelined", "chunk_fwd_ws", "chunk_fwd_wy"])
@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vk"])
def test_chunk_skip_matches_the_twin(variant, state_v_first):
    """The recurrence kernel's chunk_skip / has_skip against its float64 twin on the same bf16 inputs:
    per-(sequence, head) first chunks (0, inside, past the end), o / h rows of skipped chunks
    untouched, h rows at their chunk index, final states, with the grid rows in a scrambled order (seq_order);
    has_skip = 0 with a [1, H] dummy = no skip."""
    from qlabench.kernels.common.chunks import build_chunk_table
    from qlabench.kernels.common.cumsum import chunk_local_cumsum
    from qlabench.kernels.dispatch import arch_for_device, kernel_factory
    from qlabench.kernels.emulate_fwd import twin_chunk_fwd_kernel

    H, C = 4, 64
    cu = [0, 1000, 1000, 1700, 4000]
    T = 4096  # + a padding tail
    inp = make_inputs(T, 2, H, cu_seqlens=cu, gate="bench", h0=True, state_v_first=state_v_first, seed=11)
    arch = arch_for_device(inp["q"].device)
    dev = inp["q"].device
    q2, k2, v2 = (inp[x][0].contiguous() for x in ("q", "k", "v"))
    g2, b2 = inp["g"][0].contiguous(), inp["beta"][0].contiguous()
    cu_t = inp["cu_seqlens"]
    table = build_chunk_table(cu_t, T, C)
    gc = chunk_local_cumsum(g2, table, C, arch.name)
    A, Ag, Pm = (torch.empty(T, H, C, dtype=torch.bfloat16, device=dev) for _ in range(3))
    scale = 128 ** -0.5
    kernel_factory(arch, "kkt_solve")(2, H, 128, C, "bfloat16", arch.name)(
        q2, k2, gc, b2, table.chunk_bounds, A, Ag, Pm, scale)
    skip = torch.tensor([[0, 3, 15, 16], [1, 0, 2, 0], [5, 11, 0, 1], [0, 36, 40, 7]], dtype=torch.int32, device=dev)
    h0 = inp["initial_state"]
    n_h = int(table.n_chunks_max)
    kernel = kernel_factory(arch, variant)(2, H, 128, 128, 32, C, "bfloat16", state_v_first, arch.name)
    twin = twin_chunk_fwd_kernel(2, H, 128, 128, 32, C, "bfloat16", state_v_first, arch.name)
    order = torch.tensor([2, 0, 3, 1], dtype=torch.int32, device=dev)  # any dispatch order gives the same result
    outs = {}
    for name, fn, where in (("dev", kernel, dev), ("twin", twin, "cpu")):
        args = [x.to(where) for x in (q2, k2, v2, gc, Ag, Pm, cu_t, table.chunk_offsets, order, skip, h0)]
        o = torch.full((T, H, 128), 7.0, dtype=torch.bfloat16, device=where)
        ht = torch.empty(4, H, 128, 128, dtype=torch.float32, device=where)
        h = torch.full((n_h, H, 128, 128), 7.0, dtype=torch.bfloat16, device=where)
        fn(*args, o, ht, h, scale, 1, 1, 1, 1)
        outs[name] = (o.cpu(), ht.cpu(), h.cpu())
    (o_d, ht_d, h_d), (o_t, ht_t, h_t) = outs["dev"], outs["twin"]
    assert torch.equal(o_d == 7.0, o_t == 7.0) and torch.equal(h_d == 7.0, h_t == 7.0), "rows written differ"
    written = o_t != 7.0
    assert rel_l2(o_d[written], o_t[written].float()) <= TOL
    assert rel_l2(ht_d, ht_t) <= TOL
    assert rel_l2(h_d[h_t != 7.0], h_t[h_t != 7.0].float()) <= TOL
    # has_skip = 0: a [1, H] dummy is never read, every chunk runs (= skip 0 everywhere)
    o1, o2 = (torch.empty(T, H, 128, dtype=torch.bfloat16, device=dev) for _ in range(2))
    ht1, ht2 = (torch.empty(4, H, 128, 128, device=dev) for _ in range(2))
    common = (q2, k2, v2, gc, Ag, Pm, cu_t, table.chunk_offsets, table.seq_order)
    h_unused = torch.empty(1, H, 128, 128, dtype=torch.bfloat16, device=dev)  # store_h = 0
    kernel(*common, torch.full((1, H), 9, dtype=torch.int32, device=dev), h0, o1, ht1, h_unused, scale, 1, 1, 0, 0)
    kernel(*common, torch.zeros(4, H, dtype=torch.int32, device=dev), h0, o2, ht2, h_unused, scale, 1, 1, 0, 1)
    assert torch.equal(o1, o2) and torch.equal(ht1, ht2)


def test_cp_cuda_graph_capture():
    """Planned eagerly once, a captured CP call replays without host syncs and matches the eager one."""
    from qlabench.kernels.forward_cp import chunk_gated_delta_rule_fwd_cp

    inp = make_inputs(8192, 2, 8, cu_seqlens=[0, 6000, 8192], gate="qwen", h0=True)
    x = {key: inp[key] for key in ("q", "k", "v", "g", "beta")}
    args = {"initial_state": inp["initial_state"], "cu_seqlens": inp["cu_seqlens"], "transition": "always"}
    eager = chunk_gated_delta_rule_fwd_cp(**x, **args)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        chunk_gated_delta_rule_fwd_cp(**x, **args)  # warm-up on the side stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chunk_gated_delta_rule_fwd_cp(**x, **args)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[2], eager[2]) and torch.equal(captured[4], eager[4])


@pytest.mark.parametrize("form", ["M", "rows-transposed"])
@pytest.mark.parametrize("n_long,H,n_out", [(1, 8, 32), (3, 4, 32), (2, 2, 300)])
def test_cp_correct_chain_matches_the_twin(n_long, H, n_out, form):
    """common/cp_correct (bf16 hi/lo products) against its float64 twin: a chain of n_out - 1 steps
    with transitions of spectral norm ~1 (the worst case for accumulated rounding), heads and steps
    with flag 0 whose M rows hold NaN (never read), a zero row; error of every slot <= 2e-4, 1e-3 over 299
    steps (one bf16 product per step would give ~1e-2 at 31). "rows-transposed": M read through msrc (perm[src], perm a permutation into
    a table with one row more) and transposed, as the backward's chain reads the forward's transitions, with
    M passed split (split_m) and the chain's start read from L's rows (init_rows). n_out = 300: the chain runs in
    windows of cp_correct.MAX_OUT outputs, each from the previous one's last output."""
    from qlabench.kernels.common.cp_correct import cp_correct
    from qlabench.kernels.dispatch import arch_for_device
    from qlabench.kernels.emulate_fwd import twin_cp_correct

    gen = torch.Generator().manual_seed(5)
    K = V = 128
    n_src = 40
    init = torch.randn(n_long, H, K, V, generator=gen)
    L = 0.1 * torch.randn(n_src, H, K, V, generator=gen)
    L[-1] = 0  # the zero row of the slots
    Q, _ = torch.linalg.qr(torch.randn(n_src, H, K, K, generator=gen, dtype=torch.float64))
    M = (0.999 * Q).float().contiguous()  # orthogonal-like: ||M||_2 ~ 1, so errors do not decay away
    flag = (torch.rand(n_src, H, generator=gen) < 0.7).to(torch.int32)
    flag[-1] = 0
    flag[:, 0] = 1  # one head with every transition on
    M[flag == 0] = float("nan")
    src = torch.randint(0, n_src, (n_out - 1, n_long), generator=gen, dtype=torch.int32)
    src[-1] = n_src - 1
    dev = torch.device("cuda")
    arch = arch_for_device(dev)
    got = torch.full((n_out, n_long, H, K, V), 7.0, device=dev)
    if form == "M":
        want = twin_cp_correct(init, L, M, flag, src, torch.empty(n_out, n_long, H, K, V, dtype=torch.float64), "cpu")
        cp_correct(*(x.to(dev) for x in (init, L, M, flag, src)), got, arch.name)
    else:
        from qlabench.kernels.common.cp_correct import split_m

        perm = torch.randperm(n_src + 1, generator=gen)[:n_src].to(torch.int32)  # row j of L -> row perm[j] of M
        M2 = torch.full((n_src + 1, H, K, K), float("nan"))
        M2[perm.long()] = M.transpose(-1, -2)
        flag2 = torch.zeros(n_src + 1, H, dtype=torch.int32)
        flag2[perm.long()] = flag
        # the chain starts from rows of L itself (init_rows; L passed twice), as the backward's does
        init_rows = torch.randint(0, n_src - 1, (n_long,), generator=gen, dtype=torch.int32)
        want = twin_cp_correct(L, L, M2, flag2, src, torch.empty(n_out, n_long, H, K, V, dtype=torch.float64),
                               "cpu", msrc=perm[src.long()], transpose_m=True, init_rows=init_rows)
        Ld = L.to(dev)
        cp_correct(Ld, Ld, split_m(M2.contiguous().to(dev), arch.name), flag2.to(dev), src.to(dev), got, arch.name,
                   msrc=perm[src.long()].to(dev), transpose_m=True, init_rows=init_rows.to(dev))
    got = got.cpu().double()
    assert torch.isfinite(got).all()
    err = [rel_l2(got[s], want[s]) for s in range(n_out)]
    # rounding grows with the chain (random-walk ~ sqrt(steps)); a wrong window start would be O(1)
    assert max(err) <= (2e-4 if n_out <= 32 else 1e-3), err
