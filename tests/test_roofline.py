"""Roofline counts against hand-computed values (flashqla-design.md section 7)."""

import pytest

from qlabench import roofline

T = 32768


def test_forward_counts_16_16():
    w = roofline.work("fwd", 16, 16, [T])
    assert w.flop_impl == 165_888 * T * 16 == pytest.approx(86.97e9, rel=1e-4)
    assert w.flop_min == T * (133_120 * 16 + 32_768 * 16)
    assert w.bytes_min == T * (520 * 16 + 512 * 16) + 1 * 16 * 131_072 == pytest.approx(543e6, rel=2e-3)


def test_backward_counts_and_sequences():
    w = roofline.work("bwd", 16, 32, [T // 4] * 4)
    assert w.flop_impl == 491_520 * T * 32 == pytest.approx(515.4e9, rel=1e-3)
    assert w.bytes_min == T * (912 * 32 + 1024 * 16) + 4 * 32 * 196_608
    both = roofline.work("fwdbwd", 16, 32, [T])
    assert both.flop_impl == roofline.work("fwd", 16, 32, [T]).flop_impl + roofline.work("bwd", 16, 32, [T]).flop_impl


def test_h200_floors_match_design_table():
    h200 = roofline.find_gpu("NVIDIA H200")
    assert h200 is not None and h200.tflops == 790 and h200.tbps == 4.3
    assert "shared/" not in h200.source and "989" in h200.source  # the figures stated, no file outside the repo
    f = roofline.floor(roofline.work("fwd", 16, 16, [T]), h200)
    assert f.seconds == pytest.approx(126.3e-6, rel=2e-3) and f.bound == "memory"
    f = roofline.floor(roofline.work("fwd", 16, 32, [T]), h200)
    assert f.seconds == pytest.approx(220.2e-6, rel=2e-3) and f.bound == "compute"
    f = roofline.floor(roofline.work("bwd", 16, 16, [T]), h200)
    assert f.seconds == pytest.approx(326.2e-6, rel=2e-3)
    w = roofline.work("fwd", 16, 16, [T])
    assert roofline.achieved_tflops(w, 0.498) == pytest.approx(174.6, rel=1e-3)
    assert roofline.x_of_floor(w, h200, 0.498) == pytest.approx(3.94, rel=3e-3)


def test_unknown_gpu_and_bad_input():
    assert roofline.find_gpu("NVIDIA GeForce RTX 5090") is None
    assert roofline.find_gpu(None) is None
    assert "no peak figures" in roofline.unknown_gpu_note("X")
    with pytest.raises(ValueError, match="'fwdx'"):
        roofline.work("fwdx", 16, 16, [T])
    with pytest.raises(ValueError, match="h_qk=3"):
        roofline.work("fwd", 3, 16, [T])
    with pytest.raises(ValueError, match=r"\[0\]"):
        roofline.work("fwd", 16, 16, [0])
    with pytest.raises(ValueError, match="0"):
        roofline.achieved_tflops(roofline.work("fwd", 16, 16, [T]), 0)
