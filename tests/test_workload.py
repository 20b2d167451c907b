"""Seqlen patterns, gate profiles and input generation (qlabench/workload.py)."""

from __future__ import annotations

import pytest
import torch

from qlabench.workload import (
    BETA_PROFILES,
    GATE_PROFILES,
    inputs_label,
    make_gate,
    make_workload,
    parse_pattern,
    random_cut,
    scale_pattern,
)

FWD_PATTERNS = {
    "1x32768": (32768,), "1x2048": (2048,), "28672+4096": (28672, 4096), "1024+7168": (1024, 7168),
    "8192x4": (8192,) * 4, "4096x8": (4096,) * 8, "1024x8": (1024,) * 8, "4096": (4096,),
}


@pytest.mark.parametrize("text", list(FWD_PATTERNS), ids=list(FWD_PATTERNS))
def test_fixed_patterns(text):
    p = parse_pattern(text)
    assert p.seqlens == FWD_PATTERNS[text]
    assert p.name == text
    assert p.total_tokens == sum(FWD_PATTERNS[text])


@pytest.mark.parametrize("text,total,n", [("8k_1seq", 8192, 1), ("8k_4seq", 8192, 4),
                                          ("32k_4seq", 32768, 4), ("32k_8seq", 32768, 8),
                                          ("1000_3seq", 1000, 3)])
def test_random_cut_patterns(text, total, n):
    p = parse_pattern(text)
    assert p.total_tokens == total and p.n_seqs == n
    assert min(p.seqlens) >= 1
    assert parse_pattern(text).seqlens == p.seqlens  # seeded: deterministic
    if n > 1:
        assert parse_pattern(text, cut_seed=7).seqlens != p.seqlens


def test_random_cut_known_values():
    # pinned so that a pattern name keeps meaning the same sequences across runs and machines
    assert parse_pattern("32k_4seq").seqlens == (7212, 7072, 13725, 4759)
    assert random_cut(10, 10) == (1,) * 10


@pytest.mark.parametrize("bad", ["", "abc", "1x", "x4", "0x4096", "4096+", "+4", "4096+0", "32k_0seq",
                                 "8_9seq", "1x32768x2", " 1 x 2", "32K_4seq", "-5", "1.5x2"])
def test_bad_patterns_name_the_text(bad):
    with pytest.raises(ValueError) as e:
        parse_pattern(bad)
    assert "pattern" in str(e.value) and repr(bad) in str(e.value)


@pytest.mark.parametrize("text,seqlens,pad", [
    ("512*1", (1,) * 512, 0),
    ("2*63+3*65", (63, 63, 65, 65, 65), 0),
    ("100+2*7", (100, 7, 7), 0),
    ("2*63+1*65+pad1000", (63, 63, 65), 1000),
    ("1x4096+pad64", (4096,), 64),
    ("28672+4096+pad1", (28672, 4096), 1),
])
def test_counted_and_padded_patterns(text, seqlens, pad):
    p = parse_pattern(text)
    assert (p.name, p.seqlens, p.pad) == (text, seqlens, pad)
    assert p.total_tokens == sum(seqlens) and p.packed_tokens == sum(seqlens) + pad


@pytest.mark.parametrize("bad", ["0*4", "4*0", "*4", "4*", "2**3", "3*4x2", "pad10", "4096+pad0",
                                 "4096+pad", "4096+pad5+pad5", "1*2+pad-1"])
def test_bad_counted_and_padded_patterns(bad):
    with pytest.raises(ValueError) as e:
        parse_pattern(bad)
    assert "pattern" in str(e.value) and repr(bad) in str(e.value)


def test_pattern_type_error():
    with pytest.raises(TypeError):
        parse_pattern(4096)


def test_scale_pattern():
    p = scale_pattern(parse_pattern("28672+4096"), 512)
    assert p.name == "28672+4096" and p.total_tokens <= 512 and p.seqlens[0] > p.seqlens[1] >= 1
    p = scale_pattern(parse_pattern("1024x8"), 64)
    assert p.n_seqs == 8 and p.total_tokens <= 64 and min(p.seqlens) >= 1
    small = parse_pattern("100+28")
    assert scale_pattern(small, 512) is small
    with pytest.raises(ValueError):
        scale_pattern(parse_pattern("1x4096"), 0)
    padded = scale_pattern(parse_pattern("4*1000+pad1000"), 400)  # the tail shrinks by the same factor
    assert padded.total_tokens <= 400 and padded.n_seqs == 4 and padded.pad == 100
    assert scale_pattern(parse_pattern("8*1+pad3"), 512).pad == 3  # small enough: unchanged


def _gate(profile, T=4096, h_v=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return make_gate(profile, T, h_v, gen, "cpu")


def test_gate_bench_quarter_of_heads_zero():
    g = _gate("bench")
    assert g.shape == (1, 4096, 16) and g.dtype == torch.float32
    zero_heads = (g == 0).all(dim=1).squeeze(0)
    assert int(zero_heads.sum()) == 4  # 25% of 16 heads
    live = g[..., ~zero_heads]
    assert (live < 0).all()
    # logsigmoid(randn)/16: mean of logsigmoid(N(0,1)) is about -0.81, so about -0.05 per token
    assert -0.06 < float(live.mean()) < -0.045


def test_gate_qwen_strong_decay():
    g = _gate("qwen")
    assert (g <= 0).all()
    per_head = g.mean(dim=(0, 1))
    assert float(per_head[0]) == 0.0  # A = 0: no decay
    assert float(g[..., -1].mean()) < -15  # A = 16 times softplus(~1): strong decay
    assert float(g.min()) < -20


def test_gate_extreme_reaches_minus_40_and_shares_qwens_draws():
    g, q = _gate("extreme"), _gate("qwen")
    assert (g <= 0).all() and float(g[..., 0].abs().max()) == 0.0
    assert -45 < float(g[..., -1].mean()) < -35  # A = 30 times softplus(~1): about -40 per token
    # the same random draws as qwen, only the largest rate differs: 30 / 16 on the last head
    assert torch.allclose(g[..., -1], q[..., -1] * 30 / 16)


def test_gate_logsigmoid_and_unknown():
    g = _gate("logsigmoid")
    assert (g < 0).all() and -0.9 < float(g.mean()) < -0.7
    with pytest.raises(ValueError, match="nope"):
        _gate("nope")
    assert set(GATE_PROFILES) == {"bench", "qwen", "qwen_strong_last", "extreme", "logsigmoid"}


def test_kernel_test_inputs_draw_their_gates_through_workload(monkeypatch):
    """One definition of the gate profiles: tests/kernels/gdn_inputs.make_inputs (the GPU kernel tests'
    inputs) gets g from qlabench.workload.make_gate, the function the suite's inputs use, and has no
    gate formula of its own."""
    import ast
    import inspect

    from qlabench import workload
    from tests.kernels import gdn_inputs

    assert gdn_inputs.workload is workload
    calls = []
    real = workload.make_gate

    def spy(profile, T, h_v, gen, device, *, batch=1):
        g = real(profile, T, h_v, gen, device, batch=batch)
        calls.append(((profile, T, h_v, batch), g))
        return g

    monkeypatch.setattr(workload, "make_gate", spy)
    for gate, profile in gdn_inputs.GATE_PROFILE.items():
        calls.clear()
        inp = gdn_inputs.make_inputs(40, 2, 4, B=3, gate=gate, device="cpu", D=8, seed=1)
        [(args, g)] = calls
        assert args == (profile, 40, 4, 3) and torch.equal(inp["g"], g)
    assert set(gdn_inputs.GATE_PROFILE.values()) <= set(GATE_PROFILES)
    with pytest.raises(ValueError, match="'nope'"):
        gdn_inputs.make_inputs(40, 2, 4, gate="nope", device="cpu", D=8)
    # no formula of its own: no logsigmoid / softplus / randperm in gdn_inputs.make_inputs
    tree = ast.parse(inspect.getsource(gdn_inputs.make_inputs))
    called = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert not called & {"logsigmoid", "softplus", "randperm", "rand"}, called


def test_kernel_test_gate_values():
    """The distributions the GPU kernel tests draw (the values they had before sharing make_gate):
    bench = logsigmoid(randn)/16 with a quarter of the v-heads at 0 (shared over the batch), qwen with
    the first head at A = 0 and the last at 16, and with one v-head that head at 16."""
    from tests.kernels.gdn_inputs import make_inputs

    g = make_inputs(2048, 2, 8, B=3, gate="bench", device="cpu", D=8, seed=0)["g"]
    zero = (g == 0).all(dim=1)
    assert g.shape == (3, 2048, 8) and zero.sum(dim=1).tolist() == [2, 2, 2] and (zero == zero[0]).all()
    assert -0.06 < float(g[..., ~zero[0]].mean()) < -0.045
    g = make_inputs(2048, 2, 4, gate="qwen", device="cpu", D=8, seed=0)["g"]
    assert float(g[..., 0].abs().max()) == 0.0 and float(g[..., -1].mean()) < -15
    g1 = make_inputs(2048, 1, 1, gate="qwen", device="cpu", D=8, seed=0)["g"]  # test_dg_stress_gpu's H1
    assert float(g1.mean()) < -15 and float(g1.min()) < -20
    # qwen_strong_last is qwen wherever qwen has a first and a last head
    for h_v in (2, 4, 16):
        a = make_gate("qwen", 64, h_v, torch.Generator().manual_seed(7), "cpu")
        b = make_gate("qwen_strong_last", 64, h_v, torch.Generator().manual_seed(7), "cpu")
        assert torch.equal(a, b)
    assert float(make_gate("qwen", 64, 1, torch.Generator().manual_seed(7), "cpu").abs().max()) == 0.0


def test_qwen_strong_last_is_a_suite_profile():
    """The stress sweep's few-head profile: make_workload (the suite's inputs) draws it, the lone v-head
    of hk1_hv1 decays strongly (qwen leaves it at A = 0), and with more v-heads it is qwen's draw."""
    w = make_workload(1, 1, (300, 1, 64, 129, 65), "qwen_strong_last", seed=5, head_dim=16, pad=37)
    assert w.g.shape == (1, 596, 1) and float(w.g.mean()) < -15 and float(w.g.max()) < -1
    assert float(make_workload(1, 1, (64,), "qwen", seed=5, head_dim=16).g.abs().max()) == 0.0
    for h_qk, h_v in ((4, 4), (2, 8)):
        a = make_workload(h_qk, h_v, (30, 1, 7), "qwen_strong_last", seed=9, head_dim=16, pad=3)
        b = make_workload(h_qk, h_v, (30, 1, 7), "qwen", seed=9, head_dim=16, pad=3)
        assert torch.equal(a.g, b.g) and torch.equal(a.q, b.q) and torch.equal(a.dht, b.dht)
        assert float(a.g[..., -1].mean()) < -15 and float(a.g[..., 0].abs().max()) == 0.0


def test_make_gate_batch_shares_head_choices_and_keeps_batch1_draws():
    one = make_gate("qwen", 50, 4, torch.Generator().manual_seed(2), "cpu")
    also = make_gate("qwen", 50, 4, torch.Generator().manual_seed(2), "cpu", batch=1)
    assert torch.equal(one, also)
    three = make_gate("bench", 50, 8, torch.Generator().manual_seed(2), "cpu", batch=3)
    assert three.shape == (3, 50, 8)
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="batch"):
            make_gate("bench", 50, 8, torch.Generator(), "cpu", batch=bad)


def test_make_workload_shapes_dtypes_and_seed():
    w = make_workload(2, 8, (100, 28), "bench", seed=3, head_dim=32)
    assert w.q.shape == (1, 128, 2, 32) and w.q.dtype == torch.bfloat16
    assert w.v.shape == (1, 128, 8, 32) and w.v.dtype == torch.bfloat16
    assert w.g.shape == (1, 128, 8) and w.g.dtype == torch.float32
    assert w.beta.dtype == torch.float32 and (w.beta > 0).all() and (w.beta < 1).all()
    assert w.h0.shape == (2, 8, 32, 32) and w.dht.shape == (2, 8, 32, 32)
    assert w.do.shape == w.v.shape and w.do.dtype == torch.bfloat16
    assert w.cu_seqlens.dtype == torch.int32 and w.cu_seqlens.tolist() == [0, 100, 128]
    norms = w.q.float().norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-2)
    w2 = make_workload(2, 8, (100, 28), "bench", seed=3, head_dim=32)
    assert torch.equal(w.q, w2.q) and torch.equal(w.g, w2.g) and torch.equal(w.h0, w2.h0)
    w3 = make_workload(2, 8, (100, 28), "bench", seed=4, head_dim=32)
    assert not torch.equal(w.q, w3.q)
    assert make_workload(1, 2, (16,), seed=0, head_dim=8, with_h0=False).h0 is None


def test_make_workload_bad_input():
    with pytest.raises(ValueError, match="multiple"):
        make_workload(3, 8, (16,))
    with pytest.raises(ValueError, match="seqlens"):
        make_workload(1, 2, (16, 0))
    with pytest.raises(ValueError, match="'near2'"):
        make_workload(1, 2, (16,), beta_profile="near2")
    for bad in (0, -1.0, float("inf"), "10", True):
        with pytest.raises(ValueError, match="h0_scale"):
            make_workload(1, 2, (16,), h0_scale=bad)
    with pytest.raises(ValueError, match="pad"):
        make_workload(1, 2, (16,), pad=-1)


def test_beta_profiles_and_h0_scale_transform_the_same_draws():
    base = make_workload(1, 4, (40, 24), "qwen", seed=2, head_dim=8)
    assert set(BETA_PROFILES) == {"sigmoid", "near0", "near1"}
    near0 = make_workload(1, 4, (40, 24), "qwen", seed=2, head_dim=8, beta_profile="near0")
    near1 = make_workload(1, 4, (40, 24), "qwen", seed=2, head_dim=8, beta_profile="near1")
    assert torch.equal(near0.q, base.q) and torch.equal(near0.g, base.g) and torch.equal(near0.h0, base.h0)
    assert float(near0.beta.max()) < 0.02 and float(near0.beta.min()) > 0
    assert float(near1.beta.min()) > 0.98 and float(near1.beta.max()) < 1
    logit = torch.logit(base.beta.double())  # the same randn under each shift
    assert torch.allclose(torch.logit(near0.beta.double()), logit - 8, atol=1e-3)
    big = make_workload(1, 4, (40, 24), "qwen", seed=2, head_dim=8, h0_scale=100)
    assert torch.equal(big.h0, base.h0 * 100) and torch.equal(big.beta, base.beta)


def test_padding_tail_workload():
    w = make_workload(1, 2, (5, 3), seed=0, head_dim=8, pad=7)
    assert w.q.shape[1] == 15 and w.g.shape[1] == 15 and w.do.shape[1] == 15
    assert w.cu_seqlens.tolist() == [0, 5, 8] and w.h0.shape[0] == 2 and w.seqlens == (5, 3)


def test_inputs_label():
    assert inputs_label("bench") == "bench" == inputs_label("bench", "sigmoid", 1.0)
    assert inputs_label("qwen", "near1", 100) == "qwen beta=near1 h0x100"
    assert inputs_label("extreme", None, 0.5) == "extreme h0x0.5"


def test_differentiable_copy():
    w = make_workload(1, 2, (16,), seed=0, head_dim=8)
    wd, leaves = w.differentiable()
    assert len(leaves) == 6 and all(t.requires_grad for t in leaves)
    assert not w.q.requires_grad and torch.equal(wd.q, w.q)
