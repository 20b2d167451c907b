"""hopper/chunk_fwd_wy (the WY form of the warp-specialized forward recurrence, sm90's default at V tile
64) compiles for sm_90a on a machine without a GPU, and its generated source has the structure its header
promises: four warpgroups with their register quotas, the TMA loads on the ring's mbarriers, the wu
warpgroup's hand-off to the state warpgroup, and no block-wide barrier inside the role branches."""

from __future__ import annotations

import pytest

from .compiled_source import SMEM_PER_BLOCK, dynamic_shared_memory

HK, HV, D, C = 16, 64, 128, 64


# BV 64 (where it is the default) in the default run; BV 32 and the V-first layout behind `-m slow`
@pytest.mark.parametrize("BV,state_v_first", [pytest.param(64, False, id="bv64-kv"),
                                              pytest.param(64, True, id="bv64-vk", marks=pytest.mark.slow),
                                              pytest.param(32, False, id="bv32-kv", marks=pytest.mark.slow)])
def test_chunk_fwd_wy_compiles_sm90a(BV, state_v_first, tmp_path, monkeypatch):
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("QLABENCH_WS_AUTO_SYNC", raising=False)
    from qlabench.kernels.hopper import chunk_fwd_wy as wy

    kernel = wy.chunk_fwd_wy_kernel(HK, HV, D, D, BV, C, "bfloat16", state_v_first, "sm90")
    src = kernel.get_kernel_source()

    assert f"__launch_bounds__({wy.THREADS}, 1)" in src and wy.THREADS == 512  # four warpgroups
    # TMA loads into each of the two ring slots: the chain's K, V, Ag counted on full[slot], the output's Q, Pm
    # on full_o[slot] (the wu warpgroup starts before they land)
    for desc, bar in (("k_desc", "full"), ("v_desc", "full"), ("Ag_desc", "full"), ("q_desc", "full_o"),
                      ("Pm_desc", "full_o")):
        assert src.count(f"tl::tma_load({desc}, {bar}[0]") == 1 and src.count(f"tl::tma_load({desc}, {bar}[1]") == 1
    assert "full_o[0].wait(" in src and "full_o[1].wait(" in src
    # register quotas: the producer releases, the three compute warpgroups take (sum 4 x 128)
    assert src.count(f"warpgroup_reg_dealloc<{wy.NREG_PRODUCER}>") == 1
    assert src.count(f"warpgroup_reg_alloc<{wy.NREG_WU}>") == 1
    # the wu warpgroup's Ag diag(-e) stays in registers: ldmatrix in, wgmma with A from registers (one per
    # slot), U and -W issued before one wait
    assert src.count("ptx_ldmatrix") == 2 and src.count("tl::wgmma_rs<") == 2
    assert wy.NREG_PRODUCER + wy.NREG_STATE + wy.NREG_OUTPUT + wy.NREG_WU == 4 * 128
    # the state warpgroup waits for the wu warpgroup's U, W of each slot
    assert "wu_ready[0].wait(" in src and "wu_ready[1].wait(" in src
    # the wu warpgroup's own smem writes are fenced before its wgmma reads (named barrier 3)
    assert "__sync_thread_partial(3, 128)" in src
    # every C x BV / C x K / K x BV tile a role hands on leaves its registers by stmatrix: S, Vd, Vr
    # (state), U, -W (wu), O (output), in each of the two ring slots
    assert src.count("ptx_stmatrix") == 12
    # the only block-wide barrier is the one after the mbarrier init
    assert src.count("__syncthreads()") == 1
    assert src.index("__syncthreads()") < src.index("warpgroup_reg_dealloc")

    smem = dynamic_shared_memory(kernel)
    assert smem <= SMEM_PER_BLOCK - 4096, smem
