"""The FlashInfer backend (qlabench/baselines/flashinfer.py) on the CPU, against a fake FlashInfer that
follows its documented contract (layouts, multiplicative gate, [N, H, V, K] states, a torch.empty
output); and on a GPU against the real library (``gpu``: skipped without CUDA or without FlashInfer).
"""

from __future__ import annotations

import gc
import sys
import types

import pytest
import torch

from qlabench import backends as B
from qlabench import results as R
from qlabench import runner as RN
from qlabench.baselines import flashinfer as FI
from qlabench.check import compare
from qlabench.config import Case, Preset
from qlabench.kernels.reference import chunk_gated_delta_rule_ref
from qlabench.workload import make_workload, parse_pattern
from tests.clitools import invoke

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
# the entry name of FlashInfer's SM90 GDN prefill kernel, as its CuTe DSL compiler wrote it into the PTX
# here (compiled on the CPU for sm_90a; a GPU's tensors say gmem for generic), and one of the CP path's
SM90_KERNEL = ("kernel_cutlass_kernel_flashinfergdn_kernelsdelta_rule_dsldelta_rule_sm90_FullyFusedDeltaRuleSm90"
               "_object_at__tensorptrf32genericalign16o1_tensorptrf32genericalign16o1_CopyAtom_ThrID10_TVLa_0")
CP_KERNEL = ("kernel_cutlass_kernel_flashinfergdn_kernelsdelta_rule_dsldelta_rule_cp_sm90_CPDeltaRuleMNPrecomputeSm90"
             "_object_at__tensorptrbf16gmemalign16o_0")
FLA_FWD = ["chunk_local_cumsum_scalar_kernel", "chunk_gated_delta_rule_fwd_kkt_solve_kernel",
           "recompute_w_u_fwd_kernel", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "chunk_fwd_kernel_o"]


def fake_chunk_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                                output_final_state=False, cu_seqlens=None, use_qk_l2norm_in_kernel=False,
                                output=None, output_state=None, use_cp="auto", backend="auto", max_seqlen=None):
    """FlashInfer 0.7.2's contract, computed by the float64 reference: q/k/v ``[T, H, D]``, g the
    multiplicative gate alpha (the kernel takes log2(alpha + 1e-10)), states ``[N, H, V, K]``, an output
    it allocates with torch.empty (NaN here: the padding tail stays unwritten) unless given one."""
    fake_chunk_gated_delta_rule.calls.append({"backend": backend, "max_seqlen": max_seqlen, "scale": scale,
                                              "output": output, "q": q, "alpha": g})
    assert q.dim() == 3 and q.is_contiguous() and g.dtype == torch.float32 and g.shape == v.shape[:2]
    assert initial_state is None or initial_state.is_contiguous()
    T = q.shape[0]
    if output is None:
        output = torch.full(v.shape, float("nan"), dtype=q.dtype)
    log_gate = torch.log(g.double() + 1e-10)
    o, ht = chunk_gated_delta_rule_ref(q[None], k[None], v[None], log_gate[None], beta[None], scale=scale,
                                       initial_state=initial_state, output_final_state=True,
                                       cu_seqlens=cu_seqlens, state_v_first=True)
    end = int(cu_seqlens[-1])
    output[:end] = o[0, :end].to(output.dtype)
    assert output.shape[0] == T
    return output, ht.float()


fake_chunk_gated_delta_rule.calls = []


@pytest.fixture
def fake_flashinfer(monkeypatch):
    """A CUDA-looking torch (sm_90) and a ``flashinfer.gdn_prefill`` module holding the fake; the
    backend's class attributes are restored afterwards."""
    pkg = types.ModuleType("flashinfer")
    pkg.__path__ = []
    mod = types.ModuleType("flashinfer.gdn_prefill")
    mod.chunk_gated_delta_rule = fake_chunk_gated_delta_rule
    mod.chunk_gated_delta_rule_sm90 = object()
    pkg.gdn_prefill = mod
    monkeypatch.setitem(sys.modules, "flashinfer", pkg)
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_prefill", mod)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    for attr in ("_fn", "_extra", "_takes_max_seqlen"):
        monkeypatch.setattr(FI.FlashInferBackend, attr, getattr(FI.FlashInferBackend, attr))
    fake_chunk_gated_delta_rule.calls = []
    return mod


def _reference(w):
    o, ht = chunk_gated_delta_rule_ref(w.q.double(), w.k.double(), w.v.double(), w.g.double(), w.beta.double(),
                                       scale=w.scale, initial_state=None if w.h0 is None else w.h0.double(),
                                       output_final_state=True, cu_seqlens=w.cu_seqlens)
    return {"o": o, "final_state": ht}


# --- registration, availability --------------------------------------------------------------------


def test_registered_after_flash_qla_forward_only():
    names = B.backend_names()
    assert "flashinfer" in names and names.index("flash_qla") < names.index("flashinfer") < names.index("torch")
    b = B.get_backend("flashinfer")
    assert isinstance(b, FI.FlashInferBackend) and b.name == "flashinfer" and b.phases == ("fwd",)
    assert b.supports("fwd") == (True, "")
    ok, why = b.supports("bwd")
    assert not ok and "no backward" in why
    assert B.parse_backends("flashinfer,torch") == ["flashinfer", "torch"]
    with pytest.raises(ValueError, match="takes no options"):
        B.get_backend("flashinfer:cp=on")
    assert B.get_backend("torch").supports("fwdbwd") == (True, "")  # the default: every phase


def test_no_registry_cycle_and_no_import_at_module_level():
    assert "flashinfer" not in FI.__dict__  # the library is imported inside available()
    from tests.test_backends import ROOT, _imported_modules

    mods = _imported_modules(ROOT / "qlabench" / "baselines" / "flashinfer.py")
    assert "qlabench.backends" not in mods and not any(m.startswith("flashinfer") for m in mods)


@CPU_ONLY
def test_unavailable_on_cpu_with_reason():
    b = B.get_backend("flashinfer")
    assert b.available("cpu") == (False, "flashinfer runs on CUDA GPUs only (device=cpu)")
    assert b.available("cuda") == (False, "no CUDA GPU visible to torch")


def test_unavailable_with_the_import_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import flashinfer -> ImportError
    monkeypatch.setattr(FI.FlashInferBackend, "_fn", None)
    ok, why = B.get_backend("flashinfer").available("cuda")
    assert not ok and why.startswith("import flashinfer.gdn_prefill failed: ModuleNotFoundError: ")


def test_unavailable_on_other_archs_and_without_the_sm90_kernel(fake_flashinfer, monkeypatch):
    b = B.get_backend("flashinfer")
    assert b.available("cuda") == (True, "")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    ok, why = b.available("cuda")
    assert not ok and "no kernel for sm_80" in why
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    fake_flashinfer.chunk_gated_delta_rule_sm90 = None  # FlashInfer sets it so when the CuTe DSL import fails
    ok, why = b.available("cuda")
    assert not ok and "sm_9x GDN kernel did not import" in why
    assert "flashinfer.gdn_kernels.delta_rule_dsl.delta_rule_sm90: ModuleNotFoundError" in why
    del fake_flashinfer.chunk_gated_delta_rule
    ok, why = b.available("cuda")
    assert not ok and why == "flashinfer.gdn_prefill has no chunk_gated_delta_rule"


# --- conversions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("h_qk,h_v,seqlens,gate,pad,h0", [
    (1, 2, (20, 12), "qwen", 0, True),        # GVA 2, two sequences, strong decay
    (2, 2, (33,), "bench", 0, False),         # no initial state, 25% of heads at g = 0
    (1, 4, (7, 1, 16), "extreme", 5, True),   # a padding tail, gates down to -40 per token
])
def test_forward_converts_to_and_from_flashinfer(fake_flashinfer, h_qk, h_v, seqlens, gate, pad, h0):
    w = make_workload(h_qk, h_v, seqlens, gate, seed=3, head_dim=16, with_h0=h0, pad=pad)
    b = B.get_backend("flashinfer")
    assert b.available("cuda") == (True, "")
    with torch.no_grad():
        o, ht = b.forward(w)
    assert o.shape == w.v.shape and o.dtype == w.v.dtype
    assert ht.shape == (len(seqlens), h_v, 16, 16) and ht.dtype == torch.float32
    v = compare({"o": o, "final_state": ht}, _reference(w))
    assert v.ok, v.message()
    assert v.errors["o"] < 1e-2 and v.errors["final_state"] < 1e-5  # bf16 output; the state in fp32
    if pad:
        assert torch.equal(o[0, sum(seqlens):], torch.zeros_like(o[0, sum(seqlens):]))
    call = fake_flashinfer.chunk_gated_delta_rule.calls[-1]
    assert call["backend"] == "flashinfer" and call["scale"] == w.scale
    assert call["max_seqlen"] == max(max(seqlens), -(-(sum(seqlens) + pad) // len(seqlens)))
    assert (call["output"] is not None) == bool(pad)
    assert call["q"].data_ptr() == w.q.data_ptr()  # q, k, v, beta: views, no copy


def test_to_flashinfer_layout_and_gate():
    w = make_workload(1, 2, (5, 3), "qwen", seed=2, head_dim=8, pad=2)
    a = FI.to_flashinfer(w)
    torch.testing.assert_close(a.alpha, torch.exp(w.g[0]))
    assert a.alpha.shape == (10, 2) and a.alpha.is_contiguous()
    torch.testing.assert_close(a.h0, w.h0.transpose(-1, -2))
    assert a.h0.is_contiguous() and a.h0.data_ptr() != w.h0.data_ptr()
    assert a.output.shape == (10, 2, 8) and not a.output.any() and a.max_seqlen == 5
    assert a.made_from(w)
    o, ht = FI.from_flashinfer(torch.zeros(10, 2, 8), a.h0)
    assert o.shape == (1, 10, 2, 8) and torch.equal(ht, w.h0)
    w.h0.add_(1.0)  # modified in place: no longer what the copies were made from
    assert not a.made_from(w)
    with pytest.raises(ValueError, match="B = 1"):
        FI.flat(torch.zeros(2, 3, 1, 4))


def test_conversions_made_once_per_workload_and_released_with_it(fake_flashinfer, monkeypatch):
    made = []
    real = FI.to_flashinfer
    monkeypatch.setattr(FI, "to_flashinfer", lambda w, **kw: made.append(w) or real(w, **kw))
    b = B.get_backend("flashinfer")
    w = make_workload(1, 2, (9, 4), "bench", seed=1, head_dim=8)
    with torch.no_grad():
        for _ in range(3):
            b.forward(w)
        assert len(made) == 1 and b._prep is not None
        w2 = make_workload(1, 2, (9, 4), "bench", seed=2, head_dim=8)
        b.forward(w2)
        assert len(made) == 2 and b._prep.made_from(w2)
    made.clear()
    del w, w2
    gc.collect()
    assert b._prep is None  # the workload's copies go with it


def test_forward_refuses_gradients(fake_flashinfer):
    b = B.get_backend("flashinfer")
    wd, _ = make_workload(1, 2, (8,), "bench", head_dim=8).differentiable()
    with pytest.raises(NotImplementedError, match="no backward"):
        b.forward(wd)


# --- kernel-path check ----------------------------------------------------------------------------


def test_kernel_classification():
    fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"
    assert FI.classify_kernels("fwd", [SM90_KERNEL]) == (True, "")
    assert FI.classify_kernels("fwd", [CP_KERNEL, SM90_KERNEL, fill]) == (True, "")
    ok, why = FI.classify_kernels("fwd", [SM90_KERNEL, *FLA_FWD])
    assert not ok and "non-FlashInfer GDN kernels ran" in why and "chunk_fwd_kernel_o" in why
    ok, why = FI.classify_kernels("fwd", [SM90_KERNEL, "tilelang_fused_gdr_fwd_kernel"])
    assert not ok and "tilelang_fused_gdr_fwd_kernel" in why
    ok, why = FI.classify_kernels("fwd", [fill])
    assert not ok and "no FlashInfer GDN kernel seen for fwd" in why and "FillFunctor" in why
    ok, why = FI.classify_kernels("fwd", ["void flashinfer::norm::RMSNormKernel<8, float>"])
    assert not ok  # FlashInfer's, but not its GDN
    assert FI.classify_kernels("fwd", [])[1].endswith("(saw: (no kernels recorded))")


def test_runner_checks_the_path_with_the_backends_rule():
    b = B.get_backend("flashinfer")
    assert type(b).check_kernels is not B.Backend.check_kernels
    assert b.check_kernels("fwd", [SM90_KERNEL]) == (True, "")


# --- the runner and the command line on the CPU ---------------------------------------------------


class ForwardOnly(B.Backend):
    """The float64 reference, forward only (FlashInfer's shape of support), on the CPU."""

    name = "fwd_only"
    expects_cuda = False
    phases = ("fwd",)

    def forward(self, w):
        return chunk_gated_delta_rule_ref(w.q, w.k, w.v, w.g, w.beta, scale=w.scale, initial_state=w.h0,
                                          output_final_state=True, cu_seqlens=w.cu_seqlens)


def test_runner_records_unsupported_phases_as_unavailable():
    preset = Preset("hk1_hv2", 1, 2, "tiny")
    cases = [Case(ph, preset, parse_pattern("16+8")) for ph in ("fwd", "bwd", "fwdbwd")]
    res = R.new_results({"gpu_name": None}, {"argv": []})
    cfg = RN.RunConfig(device="cpu", warmup=0, repeats=1, head_dim=16)
    rows = RN.Runner(cfg, [ForwardOnly()], res, None, progress=False).run(cases)["rows"]
    status = {r["phase"]: (r["status"], r["message"]) for r in rows}
    assert status["fwd"][0] == "ok"
    assert status["bwd"] == ("unavailable", "fwd_only implements fwd only, not bwd")
    assert status["fwdbwd"][0] == "unavailable"


@CPU_ONLY
def test_cli_run_records_unavailable_rows(tmp_path):
    out = tmp_path / "fi.json"
    res = invoke("run", "--cfg", "hk1_hv2", "--seqlens", "1x4096", "--phase", "fwd", "--device", "cpu", "--quick",
                 "--backends", "flashinfer,torch", "--out", str(out), "--no-progress")
    assert res.exit_code == 0, res.output
    rows = {r["backend"]: r for r in R.load(out)["rows"]}
    assert rows["torch"]["status"] == "ok"
    assert rows["flashinfer"]["status"] == "unavailable"
    assert rows["flashinfer"]["message"] == "flashinfer runs on CUDA GPUs only (device=cpu)"


@CPU_ONLY
def test_list_backends_shows_flashinfer():
    res = invoke("list", "backends", "--device", "cpu")
    assert res.exit_code == 0 and "flashinfer unavailable: flashinfer runs on CUDA GPUs only" in res.output


# --- on the GPU, with the real library ------------------------------------------------------------


def _real_backend():
    b = B.get_backend("flashinfer")
    ok, why = b.available("cuda")
    if not ok:
        pytest.skip(f"flashinfer unavailable: {why}")
    return b


@pytest.mark.gpu
@pytest.mark.parametrize("h_qk,h_v,pattern,gate", [
    # sequences x v-heads under 66 (half an H200's SMs): FlashInfer's context-parallel kernels
    (2, 8, "1500+2596", "bench"),          # GVA 4, partial last chunks
    (1, 2, "128*3+100+pad77", "extreme"),  # a padding tail, gates down to -40 per token
    # 66 and over: its one fused kernel per (sequence, head)
    (4, 16, "300*8+77", "qwen"),           # 9 x 16
    (2, 8, "64*8+33+pad50", "bench"),      # 9 x 8, a padding tail
])
def test_gpu_forward_matches_reference_and_kernel_path(h_qk, h_v, pattern, gate):
    b = _real_backend()
    p = parse_pattern(pattern)
    w = make_workload(h_qk, h_v, p.seqlens, gate, seed=5, device="cuda", pad=p.pad)
    ref = RN.reference_outputs("fwd", w)
    call = RN._PhaseCall("fwd", b, w)
    out = call.named(call())
    v = compare(out, ref)
    assert v.ok, v.message()
    names = RN._kernel_names(call, "cuda")
    ok, why = b.check_kernels("fwd", names)
    assert ok, f"{why}; kernels: {names}"
