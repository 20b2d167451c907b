"""Bad input is refused at the API boundary with ValueError/TypeError naming the offending value."""

from __future__ import annotations

import re

import pytest
import torch

from qlabench import kernels
from qlabench.kernels.reference import chunk_gated_delta_rule_ref, recurrent_gated_delta_rule_ref
from qlabench.kernels.validate import validate


def make(B=1, T=8, h_qk=2, h_v=4, K=16, V=16, dtype=torch.float32, N=None, state_v_first=False):
    """Valid inputs (q, k, v, g, beta) and an initial state for N sequences."""
    q = torch.randn(B, T, h_qk, K, dtype=dtype)
    k = torch.randn(B, T, h_qk, K, dtype=dtype)
    v = torch.randn(B, T, h_v, V, dtype=dtype)
    g = -torch.rand(B, T, h_v)
    beta = torch.rand(B, T, h_v)
    n = B if N is None else N
    h0 = torch.zeros((n, h_v, V, K) if state_v_first else (n, h_v, K, V))
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta}, h0


def raises(exc, *fragments):
    """pytest.raises matching every fragment of the message literally, in order."""
    return pytest.raises(exc, match=".*".join(re.escape(f) for f in fragments))


def test_valid_problem_sizes():
    x, h0 = make(B=1, T=20, h_qk=2, h_v=6, K=16, V=8, N=3)
    p = validate(**x, initial_state=h0, cu_seqlens=torch.tensor([0, 5, 5, 17], dtype=torch.int32))
    assert (p.B, p.T, p.h_qk, p.h_v, p.K, p.V, p.N, p.group) == (1, 20, 2, 6, 16, 8, 3, 3)
    assert p.seq_bounds == ((0, 5), (5, 5), (5, 17))
    assert p.scale == pytest.approx(16**-0.5)
    dense = validate(**make(B=3, T=7)[0], scale=2)
    assert dense.seq_bounds == ((0, 7), (7, 14), (14, 21)) and dense.N == 3 and dense.scale == 2.0


@pytest.mark.parametrize("name,shape", [("q", (8, 2, 16)), ("k", (1, 1, 8, 2, 16)), ("v", (8, 4, 16)),
                                        ("g", (1, 8)), ("beta", (1, 8, 4, 1))],
                         ids=["q", "k", "v", "g", "beta"])
def test_wrong_ndim(name, shape):
    x, _ = make()
    x[name] = torch.zeros(shape)
    with raises(ValueError, name, str(shape)):
        validate(**x)


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta"])
def test_not_a_tensor(name):
    x, _ = make()
    x[name] = x[name].tolist()
    with raises(TypeError, name, "list"):
        validate(**x)


def test_integer_tensor():
    x, _ = make()
    x["beta"] = torch.ones(1, 8, 4, dtype=torch.int64)
    with raises(TypeError, "beta", "torch.int64"):
        validate(**x)


def test_k_shape_differs_from_q():
    x, _ = make()
    x["k"] = torch.zeros(1, 8, 2, 32)
    with raises(ValueError, "k", "(1, 8, 2, 16)", "(1, 8, 2, 32)"):
        validate(**x)


@pytest.mark.parametrize("shape", [(2, 8, 4, 16), (1, 9, 4, 16)], ids=["B", "T"])
def test_v_batch_or_tokens_differ(shape):
    x, _ = make()
    x["v"] = torch.zeros(shape)
    with raises(ValueError, "v", str(shape)):
        validate(**x)


@pytest.mark.parametrize("name", ["g", "beta"])
@pytest.mark.parametrize("shape", [(1, 8, 2), (1, 7, 4), (2, 8, 4)], ids=["H", "T", "B"])
def test_gate_or_beta_shape(name, shape):
    x, _ = make()
    x[name] = torch.zeros(shape)
    with raises(ValueError, name, "(1, 8, 4)", str(shape)):
        validate(**x)


@pytest.mark.parametrize("name", ["k", "v"])
def test_dtype_mismatch(name):
    x, _ = make()
    x[name] = x[name].to(torch.float64)
    with raises(TypeError, "torch.float64"):
        validate(**x)


@pytest.mark.parametrize("h_qk,h_v", [(2, 3), (4, 2), (3, 8)])
def test_heads_not_a_multiple(h_qk, h_v):
    x, _ = make(h_qk=h_qk, h_v=h_v)
    with raises(ValueError, f"H_v={h_v}", f"H_qk={h_qk}"):
        validate(**x)


def test_inputs_on_two_devices():
    x, _ = make()
    x["g"] = torch.empty(x["g"].shape, device="meta")
    with raises(ValueError, "meta"):
        validate(**x)


@pytest.mark.parametrize("cu,exc,fragments", [
    ([0, 3, 8], TypeError, ("cu_seqlens", "list")),
    (torch.tensor([[0, 3, 8]]), ValueError, ("cu_seqlens", "1-D", "(1, 3)")),
    (torch.tensor([0.0, 3.0, 8.0]), TypeError, ("cu_seqlens", "torch.float32")),
    (torch.tensor([0, 3, 8], dtype=torch.int16), TypeError, ("cu_seqlens", "torch.int16")),
    (torch.tensor([0]), ValueError, ("cu_seqlens", "[0]")),
    (torch.tensor([2, 3, 8]), ValueError, ("start at 0", "got 2")),
    (torch.tensor([0, 5, 3, 8]), ValueError, ("non-decreasing", "[0, 5, 3, 8]")),
    (torch.tensor([0, 3, 9]), ValueError, ("9", "T=8")),
], ids=["list", "2d", "float", "int16", "one-entry", "start", "decreasing", "beyond-T"])
def test_cu_seqlens(cu, exc, fragments):
    x, _ = make()
    with raises(exc, *fragments):
        validate(**x, cu_seqlens=cu)


def test_cu_seqlens_needs_batch_one():
    x, _ = make(B=2)
    with raises(ValueError, "B=2"):
        validate(**x, cu_seqlens=torch.tensor([0, 3, 8]))


@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "vfirst"])
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_initial_state_shape(state_v_first, varlen):
    K, V = 16, 8
    kw = {"state_v_first": state_v_first}
    if varlen:
        x, _ = make(B=1, K=K, V=V)
        kw["cu_seqlens"] = torch.tensor([0, 2, 5, 8])
        n = 3
    else:
        x, _ = make(B=2, K=K, V=V)
        n = 2
    good = (n, 4, V, K) if state_v_first else (n, 4, K, V)
    validate(**x, initial_state=torch.zeros(good), **kw)
    layout = "[N, H_v, V, K]" if state_v_first else "[N, H_v, K, V]"
    swapped = (n, 4, K, V) if state_v_first else (n, 4, V, K)
    for bad in (swapped, (n + 1,) + good[1:], (n, 2) + good[2:]):
        with raises(ValueError, "initial_state", layout, str(good), f"N={n}", str(bad)):
            validate(**x, initial_state=torch.zeros(bad), **kw)


def test_initial_state_ndim_and_device():
    x, h0 = make()
    with raises(ValueError, "initial_state", "(4, 16, 16)"):
        validate(**x, initial_state=h0[0])
    with raises(ValueError, "initial_state", "meta"):
        validate(**x, initial_state=torch.empty(h0.shape, device="meta"))


@pytest.mark.parametrize("scale", [0.0, -0.5, -1, float("nan")])
def test_scale_not_positive(scale):
    x, _ = make()
    with raises(ValueError, "scale", str(scale)):
        validate(**x, scale=scale)


@pytest.mark.parametrize("scale", ["0.1", True, torch.tensor(0.1)], ids=["str", "bool", "tensor"])
def test_scale_not_a_number(scale):
    x, _ = make()
    with raises(TypeError, "scale", type(scale).__name__):
        validate(**x, scale=scale)


def test_state_v_first_not_bool():
    x, _ = make()
    with raises(TypeError, "state_v_first", "'yes'"):
        validate(**x, state_v_first="yes")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_kernels_need_half_precision(dtype):
    x, _ = make(K=128, V=128, dtype=dtype)
    validate(**x)  # the reference takes any float dtype
    with raises(TypeError, "bf16", str(dtype)):
        validate(**x, for_kernels=True)


@pytest.mark.parametrize("K,V", [(64, 128), (128, 64), (16, 16)], ids=lambda d: f"{d}")
def test_kernels_need_head_dim_128(K, V):
    x, _ = make(K=K, V=V, dtype=torch.bfloat16)
    validate(**x)
    with raises(ValueError, "128", f"K={K}", f"V={V}"):
        validate(**x, for_kernels=True)
    validate(**make(K=128, V=128, dtype=torch.float16)[0], for_kernels=True)


@pytest.mark.parametrize("fn", [chunk_gated_delta_rule_ref, recurrent_gated_delta_rule_ref],
                         ids=["chunk", "recurrent"])
def test_reference_validates_too(fn):
    x, _ = make(h_qk=3, h_v=4)
    with raises(ValueError, "H_v=4", "H_qk=3"):
        fn(**x)


@pytest.mark.parametrize("chunk_size", [0, -16, 16.0])
def test_reference_chunk_size(chunk_size):
    x, _ = make()
    with raises(ValueError, "chunk_size", repr(chunk_size)):
        chunk_gated_delta_rule_ref(**x, chunk_size=chunk_size)


# --- the public kernel API ----------------------------------------------------------------------

def test_public_api_validates_before_device_work():
    x, _ = make(h_qk=3, h_v=4, K=128, V=128, dtype=torch.bfloat16)
    with raises(ValueError, "H_v=4", "H_qk=3"):
        kernels.chunk_gated_delta_rule(**x)
    x, _ = make(K=128, V=128, dtype=torch.float32)
    with raises(TypeError, "torch.float32"):
        kernels.chunk_gated_delta_rule(**x)
    x, _ = make(K=64, V=128, dtype=torch.bfloat16)
    with raises(ValueError, "K=64"):
        kernels.chunk_gated_delta_rule(**x)


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_public_api_on_cpu_points_at_reference(varlen):
    """A valid call on CPU tensors is refused with a pointer to the float64 reference."""
    x, h0 = make(B=1, T=8, K=128, V=128, dtype=torch.bfloat16, N=2 if varlen else 1)
    kw = {"cu_seqlens": torch.tensor([0, 3, 8])} if varlen else {}
    with raises(ValueError, "chunk_gated_delta_rule_ref"):
        kernels.chunk_gated_delta_rule(**x, initial_state=h0, output_final_state=True, **kw)
