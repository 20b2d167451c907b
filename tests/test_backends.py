"""Backend registry, availability on CPU, the torch backend, FLA kernel-path classification."""

from __future__ import annotations

import pytest
import torch

from qlabench import backends as B
from qlabench.baselines.fla_triton import classify_kernels
from qlabench.check import compare, rel_l2
from qlabench.kernels.reference import chunk_gated_delta_rule_ref
from qlabench.workload import make_workload


def test_registry_names_and_errors():
    assert {"torch", "fla", "flash_qla", "qla"} <= set(B.backend_names())
    assert B.parse_backends("fla, torch,fla") == ["fla", "torch"]
    with pytest.raises(ValueError, match="'nope'"):
        B.parse_backends("torch,nope")
    with pytest.raises(ValueError, match="no backend"):
        B.parse_backends(" , ")
    with pytest.raises(ValueError, match="unknown backend 'x'"):
        B.get_backend("x")


def test_register_decorator():
    @B.register("_test_dummy")
    class Dummy(B.Backend):
        pass

    try:
        assert B.get_backend("_test_dummy").name == "_test_dummy"
        with pytest.raises(ValueError, match="already registered"):
            B.register("_test_dummy")(type("Other", (B.Backend,), {}))
        with pytest.raises(TypeError):
            B.register("_test_bad")(object)
    finally:
        B.unregister("_test_dummy")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only reasons")
@pytest.mark.parametrize("name", ["fla", "flash_qla", "qla"])
def test_gpu_backends_unavailable_on_cpu_with_reason(name):
    b = B.get_backend(name)
    for device in ("cpu", "cuda"):
        ok, why = b.available(device)
        assert not ok and why
    assert B.get_backend("torch").available("cpu") == (True, "")


def test_torch_backend_forward_and_gradients_match_reference():
    w = make_workload(1, 2, (20, 12), "qwen", seed=1, head_dim=16)
    b = B.get_backend("torch")
    o, ht = b.forward(w)
    ro, rht = chunk_gated_delta_rule_ref(w.q, w.k, w.v, w.g, w.beta, initial_state=w.h0,
                                         output_final_state=True, cu_seqlens=w.cu_seqlens)
    assert rel_l2(o, ro) == 0.0 and rel_l2(ht, rht) == 0.0
    grads = B.gradients(b, w)
    assert list(grads) == list(B.GRAD_NAMES)
    assert grads["dq"].shape == w.q.shape and grads["dh0"].shape == w.h0.shape
    assert all(torch.isfinite(g.float()).all() for g in grads.values())


def test_check_metric():
    ref = torch.ones(4, dtype=torch.float64)
    assert rel_l2(ref * 1.01, ref) == pytest.approx(0.01)
    assert rel_l2(torch.zeros(4), torch.zeros(4)) == 0.0
    assert rel_l2(torch.ones(3), ref) == float("inf")
    v = compare({"o": ref * 1.05, "final_state": torch.tensor([1.0, float("nan"), 1.0, 1.0])},
                {"o": ref, "final_state": ref})
    assert v.bad == ["o", "final_state"] and "non-finite" in v.message() and "o: 0.05" in v.message()
    assert compare({"o": ref}, {"o": ref, "dq": None}).ok
    assert not compare({}, {"o": ref}).ok
    with pytest.raises(ValueError):
        compare({}, {}, tolerance=0)


FLA_FWD = ["chunk_local_cumsum_scalar_kernel", "chunk_scaled_dot_kkt_fwd_kernel", "solve_tril_64x64_kernel",
           "recompute_w_u_fwd_kernel", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "chunk_fwd_kernel_o"]


def test_fla_kernel_classification():
    assert classify_kernels("fwd", FLA_FWD) == (True, "")
    ok, why = classify_kernels("fwd", FLA_FWD + ["tilelang_fused_gdr_fwd_kernel"])
    assert not ok and "FlashQLA" in why and "tilelang_fused_gdr_fwd_kernel" in why
    ok, why = classify_kernels("fwd", ["kkt_solve_kernel", "main_kernel"])
    assert not ok
    ok, why = classify_kernels("bwd", ["void at::native::elementwise_kernel<...>"])
    assert not ok and "no FLA Triton kernel" in why
    assert classify_kernels("bwd", ["chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64"])[0]
    # the kernels FLA 0.6's Triton forward really launched on the H200 (its fused kkt+solve included)
    fla06 = ["chunk_fwd_kernel_o", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
             "chunk_gated_delta_rule_fwd_kkt_solve_kernel", "chunk_local_cumsum_scalar_kernel",
             "recompute_w_u_fwd_kernel"]
    assert classify_kernels("fwd", fla06) == (True, "")
    assert not classify_kernels("fwd", fla06 + ["kkt_solve_kernel"])[0]


def _imported_modules(path) -> set[str]:
    """Every module a file imports (module level or inside functions), relative imports resolved."""
    import ast

    rel = path.relative_to(ROOT).with_suffix("").parts
    package = list(rel if rel[-1] == "__init__" else rel[:-1])
    package = [p for p in package if p != "__init__"]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            mod = ".".join(x for x in (base, node.module) if x)
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


ROOT = __import__("pathlib").Path(B.__file__).parent.parent


def test_no_registry_cycle():
    """The registry is a leaf and the backend modules import it, never qlabench.backends (which imports
    them): no backends <-> baselines cycle."""
    pkg = ROOT / "qlabench"
    ours = {m for m in _imported_modules(pkg / "registry.py") if m.startswith("qlabench")}
    assert ours <= {"qlabench.workload", "qlabench.workload.Workload"}, ours
    for f in sorted((pkg / "baselines").glob("*.py")):
        mods = _imported_modules(f)
        assert "qlabench.backends" not in mods, f.name
    assert "qlabench.registry" in _imported_modules(pkg / "baselines" / "qla.py")


def test_runner_does_not_import_upward():
    """The runner executes a sweep; the command layer (runsetup, cli) and the reports sit above it."""
    mods = _imported_modules(ROOT / "qlabench" / "runner.py")
    upward = {m for m in mods if m.startswith(("qlabench.report", "qlabench.cli", "qlabench.runsetup"))}
    assert not upward, upward


def test_one_worker_process_mechanism():
    """shard (run --gpus/--workers/--case-timeout) and warm start, set up and kill their worker
    processes through qlabench.procs, and neither spawns a process of its own."""
    for name in ("shard.py", "warm.py"):
        path = ROOT / "qlabench" / name
        mods = _imported_modules(path)
        assert {"qlabench.procs.spawn", "qlabench.procs.become_worker", "qlabench.procs.kill_process_group"} <= mods
        text = path.read_text()
        assert ".Process(" not in text and "setpgid" not in text and "killpg" not in text, name
