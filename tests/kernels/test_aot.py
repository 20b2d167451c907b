"""`qlabench aot --arch sm90` compiles every kernel the API launches for a head configuration, on a
machine without a GPU (the CI check that the kernels build)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from qlabench.cli import main


@pytest.mark.slow  # ~4-6 min on 2 cores; the default run compiles each sm90 kernel once in its own test
def test_aot_sm90_compiles_every_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "cache"))  # restored after the test
    result = CliRunner().invoke(main, ["aot", "--arch", "sm90", "--cfg", "hk1_hv2", "--state-layout", "kv",
                                       "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 0, result.output
    lines = [line.split()[0] for line in result.output.splitlines() if line.startswith("  ")]
    assert lines.count("chunk_fwd") == 2 and lines.count("chunk_fwd_pipelined") == 2  # BV 32 and 64
    assert lines.count("chunk_fwd_ws") == 2 and lines.count("chunk_fwd_wy") == 2  # sm90's defaults
    for name in ("chunk_local_cumsum", "kkt_solve", "chunk_local_cumsum_reverse", "cp_dht_rows", "backward"):
        assert name in lines, result.output
    assert lines.count("backward") == 2  # bwd_h / bwd_dh at BV 32 and 64 (backward.value_tiles)
    assert "kernels compiled" in result.output.splitlines()[-1]
    assert any((tmp_path / "cache").rglob("*.cubin")), "no cubin written into the cache directory"


def test_aot_rejects_a_bad_head_configuration():
    result = CliRunner().invoke(main, ["aot", "--arch", "sm90", "--cfg", "hk3_hv4"])
    assert result.exit_code == 2
    assert "hk3_hv4" in result.output


def test_aot_sm90_forward_entry_kernels_compile(tmp_path, monkeypatch):
    """The default run's sm90 check of the two forward kernels no other default test compiles (the
    chunk cumsum and kkt_solve; chunk_fwd_ws and the backward have their own compile tests): aot's own
    jobs, one cubin each in a fresh cache."""
    from qlabench.kernels.aot import forward_kernels

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "cache"))
    jobs = forward_kernels(1, 2, "sm90", state_layouts=(False,))
    assert [name for name, _, _ in jobs[:2]] == ["chunk_local_cumsum", "kkt_solve"]
    for _, _, thunk in jobs[:2]:
        thunk()
    assert len(list((tmp_path / "cache").rglob("*.cubin"))) == 2
