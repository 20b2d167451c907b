"""value_tile.py: the recurrences' V tile from the grid's predicted makespan (host numbers only)."""

import pytest

from qlabench.kernels.value_tile import (
    BACKWARD_STEP_US,
    FORWARD_STEP_US,
    SIMULATED_WAVES,
    chain_chunks,
    makespan,
    value_tile,
)


def test_makespan_is_the_list_schedule_in_grid_order():
    assert makespan([7], 1, 1, 132) == 7
    assert makespan([3, 5], 1, 1, 1) == 8  # one SM: the blocks one after another
    assert makespan([3, 5, 2], 1, 1, 2) == 5  # the third block takes the SM freed at step 3
    assert makespan([512], 16, 4, 132) == 512  # 64 blocks: one wave
    assert makespan([512], 34, 4, 132) == 1024  # 136 blocks: two waves
    # 28672+4096 tokens, 32 v-heads, BV 32: 128 long blocks first, the short ones on the other 4 SMs
    # (7 each by step 448) and the last 100 after the long ones
    assert makespan([448, 64], 32, 4, 132) == 512
    assert makespan([448, 64], 32, 2, 132) == 448
    assert makespan([], 8, 4, 132) == 0


def test_makespan_of_grids_side_by_side():
    # bwd_dh's blocks are served first, bwd_h's take the SMs left and those freed
    assert makespan([512], 16, 4, 132, (1.66, 1.70)) == pytest.approx(512 * 1.70)  # 128 blocks: one wave
    assert makespan([10], 1, 1, 1, (2, 3)) == 50  # one SM: the two blocks one after another
    assert makespan([8, 2], 1, 1, 2, (1, 1)) == 10  # bwd_h's long block starts when bwd_dh's short one ends
    assert makespan([8, 2], 1, 1, 2, (1,)) == 8


@pytest.mark.parametrize("chunks,h_v,want", [
    # bwd_h and bwd_dh side by side (streams.py): BV 32 where both grids fit one wave together
    ([512], 16, 32),  # hk16_hv16 1x32768: 2 x 64 blocks at BV 32
    ([512], 17, 64),  # 2 x 68 blocks at BV 32: two waves
    ([512], 33, 64),  # 2 x 132 blocks at BV 32, 2 x 66 at BV 64: 1720 vs 1403 us predicted
    ([512], 64, 64),  # hk16_hv64 1x32768
    ([448, 64], 32, 64),  # hk16_hv32 28672+4096: 1228 vs 1720 us predicted
    ([64, 64], 8, 32),  # 2 x 64 blocks at BV 32
    ([256, 256], 48, 64),  # hk16_hv48 16384+16384
])
def test_backward_tiles(chunks, h_v, want):
    assert value_tile(chunks, h_v, 132, BACKWARD_STEP_US) == want


def test_forward_and_backward_differ_where_the_step_ratio_decides():
    # 96 equal chains: three waves at BV 32 against two at BV 64; the forward's step ratio (1.77 / 1.17)
    # is above 3 / 2, the backward's (4.68 / 3.36) below
    fwd_narrow = {bv: us for bv, us in FORWARD_STEP_US.items() if bv != 128}
    assert value_tile([128] * 4, 24, 132, fwd_narrow) == 32
    assert value_tile([128] * 4, 24, 132, BACKWARD_STEP_US) == 64
    # with sm90's BV 128 the 96 chains are one wave of 96 blocks at 3.08 us (394 us against 449 at BV 32)
    assert value_tile([128] * 4, 24, 132, FORWARD_STEP_US) == 128


@pytest.mark.parametrize("chunks,h_v,want", [
    ([512], 64, 64),  # hk16_hv64 1x32768: 64 blocks at BV 128 leave half the SMs idle
    ([128] * 4, 64, 128),  # hk16_hv64 8192x4: two waves at 128 (788 us) against four at 64 (906)
    ([64] * 8, 32, 128),  # hk32_hv32 4096x8
    ([512], 16, 32),  # hk16_hv16 1x32768
])
def test_forward_tiles(chunks, h_v, want):
    assert value_tile(chunks, h_v, 132, FORWARD_STEP_US) == want


def test_throughput_bound_grids_take_the_wide_tile_unsimulated():
    n = SIMULATED_WAVES * 132 // 4 + 1  # chains: BV 32 past SIMULATED_WAVES waves
    assert value_tile([1] * n, 1, 132, FORWARD_STEP_US) == 128
    assert value_tile([1] * n, 1, 132, {64: 1.0}) == 64  # one tile offered: that one


def test_chain_chunks():
    assert chain_chunks([(0, 1), (1, 65), (65, 65), (65, 200)], 4, 64) == (1, 1, 0, 3)
    assert chain_chunks(None, 3, 64) == (1, 1, 1)  # no host values: equal chains, the wave count decides
    assert value_tile(chain_chunks(None, 34, 64), 1, 132, FORWARD_STEP_US) == 64


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="h_v and sm_count must be positive, got 0, 132"):
        value_tile([1], 0, 132, FORWARD_STEP_US)


def test_forward_value_tile_offers_128_on_sm90_auto_only(monkeypatch):
    from qlabench.kernels.dispatch import arch_by_name
    from qlabench.kernels.forward import forward_value_tile

    monkeypatch.delenv("QLABENCH_FWD_BV", raising=False)
    monkeypatch.delenv("QLABENCH_FWD_KERNEL", raising=False)
    sm90, sm100 = arch_by_name("sm90"), arch_by_name("sm100")
    chains = [128] * 4  # hk16_hv64 8192x4
    assert forward_value_tile(chains, 64, 132, sm90, 128) == 128
    assert forward_value_tile(chains, 64, 132, sm100, 128) == 64  # no chunk_fwd_v128 there
    assert forward_value_tile(chains, 64, 132, sm90, 128, "wy") == 64  # a forced recurrence runs 32 / 64
    monkeypatch.setenv("QLABENCH_FWD_BV", "32")
    assert forward_value_tile(chains, 64, 132, sm90, 128) == 32
    monkeypatch.setenv("QLABENCH_FWD_BV", "128")
    with pytest.raises(ValueError, match="QLABENCH_FWD_BV=128 needs chunk_fwd_v128.*'ws'"):
        forward_value_tile(chains, 64, 132, sm90, 128, "ws")
    monkeypatch.setenv("QLABENCH_FWD_BV", "96")
    with pytest.raises(ValueError, match="QLABENCH_FWD_BV must be one of"):
        forward_value_tile(chains, 64, 132, sm90, 128)


def test_backward_value_tile_switch(monkeypatch):
    """QLABENCH_BWD_BV forces the V tile of bwd_h / bwd_dh (the A/B switch); a tile the arch has no kernels for, or
    a value outside 32 / 64, is a ValueError naming it."""
    from qlabench.kernels.backward import _value_tile

    chains = [512]  # hk16_hv16 1x32768 without CP: 16 blocks at either tile
    monkeypatch.delenv("QLABENCH_BWD_BV", raising=False)
    auto = _value_tile(chains, 16, 132, "sm90")
    assert auto in (32, 64)
    monkeypatch.setenv("QLABENCH_BWD_BV", "64")
    assert _value_tile(chains, 16, 132, "sm90") == 64
    monkeypatch.setenv("QLABENCH_BWD_BV", "32")
    assert _value_tile(chains, 16, 132, "sm90") == 32
    with pytest.raises(ValueError, match="QLABENCH_BWD_BV=32: sm100 has bwd_h / bwd_dh kernels for V tiles"):
        _value_tile(chains, 16, 132, "sm100")
    monkeypatch.setenv("QLABENCH_BWD_BV", "128")
    with pytest.raises(ValueError, match="QLABENCH_BWD_BV must be one of auto, 32, 64, got '128'"):
        _value_tile(chains, 16, 132, "sm90")
    monkeypatch.setenv("QLABENCH_BWD_BV", "auto")
    assert _value_tile(chains, 16, 132, "sm90") == auto
