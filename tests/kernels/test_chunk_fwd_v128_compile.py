"""hopper/chunk_fwd_v128 (sm90's forward recurrence at V tile 128) compiles for sm_90a on a machine without a
GPU, and its generated source has the structure its header promises: four warpgroups with register quotas
summing to 4 x 128, the ring's TMA loads (no Pm: the output warpgroup forms it), the single hand-off tiles
guarded by o_free, no block-wide barrier inside the role branches, and no transition mode."""

from __future__ import annotations

import pytest

from .compiled_source import SMEM_PER_BLOCK, dynamic_shared_memory

HK, HV, D, C = 16, 64, 128, 64


@pytest.mark.parametrize("state_v_first", [pytest.param(False, id="kv"),
                                           pytest.param(True, id="vk", marks=pytest.mark.slow)])
def test_chunk_fwd_v128_compiles_sm90a(state_v_first, tmp_path, monkeypatch):
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "cache"))
    from qlabench.kernels.hopper import chunk_fwd_v128 as v128

    kernel = v128.chunk_fwd_v128_kernel(HK, HV, D, D, D, C, "bfloat16", state_v_first, "sm90")
    src = kernel.get_kernel_source()

    assert f"__launch_bounds__({v128.THREADS}, 1)" in src and v128.THREADS == 512
    for desc, bar in (("k_desc", "full"), ("v_desc", "full"), ("Ag_desc", "full"), ("q_desc", "full_o")):
        assert src.count(f"tl::tma_load({desc}, {bar}[0]") == 1 and src.count(f"tl::tma_load({desc}, {bar}[1]") == 1
    # Pm is formed by the output warpgroup (Q K^T per slot, after waiting for the chain's K on full), never loaded
    assert "Pm_desc" not in src and v128.chunk_fwd_v128_kernel.forms_pm
    assert src.count("full[0].wait(") >= 3 and src.count("full[1].wait(") >= 3
    assert v128.NREG_PRODUCER + v128.NREG_STATE + v128.NREG_VALUE + v128.NREG_OUTPUT == 4 * 128
    for n in (v128.NREG_STATE, v128.NREG_VALUE, v128.NREG_OUTPUT):
        assert f"warpgroup_reg_alloc<{n}>" in src
    # one S_s / Vd_s pair: the state and value warpgroups wait for the output's o_free of the previous chunk
    assert src.count("o_free[0].wait(") >= 2 and src.count("o_free[1].wait(") >= 2
    assert "s_ready[0].wait(" in src and "vd_ready[1].wait(" in src
    # no transition mode: no identity start (has_h0 == 2) anywhere
    assert "has_h0 == 2" not in src
    assert src.count("__syncthreads()") == 1
    assert src.index("__syncthreads()") < src.index("warpgroup_reg_dealloc")

    smem = dynamic_shared_memory(kernel)
    assert smem <= SMEM_PER_BLOCK - 4096, smem


def test_rejects_other_tiles():
    from qlabench.kernels.hopper.chunk_fwd_v128 import chunk_fwd_v128_kernel

    with pytest.raises(ValueError, match="BV=64"):
        chunk_fwd_v128_kernel(HK, HV, D, D, 64, C, "bfloat16", False, "sm90")
