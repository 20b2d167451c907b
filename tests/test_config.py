"""Config files -> presets, seqlen sets, sweeps, cases (qlabench/config.py)."""

from __future__ import annotations

import shutil

import pytest

from qlabench import config as C

QWEN = {"hk2_hv8": (2, 8), "hk4_hv16": (4, 16), "hk8_hv32": (8, 32), "hk16_hv64": (16, 64),
        "hk16_hv32": (16, 32), "hk8_hv24": (8, 24), "hk16_hv48": (16, 48), "hk16_hv16": (16, 16),
        "hk32_hv32": (32, 32)}


def test_presets_hold_flashqla_qwen_set():
    presets = C.load_presets()
    for name, (hq, hv) in QWEN.items():
        assert (presets[name].h_qk, presets[name].h_v) == (hq, hv)
    assert presets["hk2_hv8"].model == "397B/122B TP8"
    assert presets["hk32_hv32"].model == "Sym h32"


@pytest.mark.parametrize("name,hq,hv", [("hk3_hv9", 3, 9), ("hk1_hv1", 1, 1), ("hk64_hv128", 64, 128)])
def test_any_hk_hv_parses(name, hq, hv):
    p = C.resolve_preset(name)
    assert (p.h_qk, p.h_v, p.model) == (hq, hv, name)


@pytest.mark.parametrize("bad", ["hk3_hv8", "hk0_hv4", "hv8", "16_32", "hk16-hv32"])
def test_bad_preset(bad):
    with pytest.raises(ValueError, match=bad):
        C.resolve_preset(bad)


def test_seqlen_sets():
    sets = C.load_seqlens()
    fwd = sets.patterns(["fwd"])
    assert len(fwd) == 19 and fwd[0].name == "1x32768" and fwd[-1].name == "1024x8"
    bwd = sets.default_for("bwd")
    assert [p.total_tokens for p in bwd] == [8192] * 4 + [32768] * 4
    assert [p.n_seqs for p in bwd] == [1, 2, 4, 8] * 2
    mixed = sets.patterns("smoke,1x100,1x100")
    assert [p.name for p in mixed][-1] == "1x100" and len(mixed) == 4
    with pytest.raises(ValueError, match="1y100"):
        sets.patterns("1y100")


def test_sweeps():
    assert {"h200-fwd", "h200-bwd", "ci-smoke"} <= set(C.sweep_names())
    fwd = C.load_sweep("h200-fwd")
    assert len(fwd.cases) == 9 * 19 and fwd.phases == ["fwd"] and fwd.arch == "sm90"
    # grouped per preset: all 19 patterns of one preset are consecutive
    assert [c.preset.name for c in fwd.cases[:19]] == ["hk2_hv8"] * 19
    bwd = C.load_sweep("h200-bwd")
    assert len(bwd.cases) == 5 * 8 * 2 and bwd.phases == ["bwd", "fwdbwd"]
    assert {c.preset.name for c in bwd.cases} == {"hk16_hv32", "hk8_hv16", "hk4_hv8", "hk2_hv4", "hk16_hv16"}
    smoke = C.load_sweep("ci-smoke")
    assert smoke.settings == {"warmup": 3, "repeats": 20} and set(smoke.phases) == {"fwd", "bwd"}
    with pytest.raises(ValueError, match="unknown sweep 'nope'"):
        C.load_sweep("nope")


def test_build_cases_and_phases():
    presets = [C.resolve_preset("hk2_hv4")]
    cases = C.build_cases(presets, C.parse_phases("all"), C.load_seqlens())
    assert [c.phase for c in cases].count("fwd") == 19
    assert [c.phase for c in cases].count("fwdbwd") == 8
    assert cases[0].label == "fwd-hk2_hv4-1x32768-bench"
    with pytest.raises(ValueError, match="sideways"):
        C.parse_phases("fwd,sideways")
    with pytest.raises(ValueError, match="zzz"):
        C.build_cases(presets, ["fwd"], C.load_seqlens(), None, gate_profile="zzz")


@pytest.fixture
def config_copy(tmp_path, monkeypatch):
    dst = tmp_path / "configs"
    shutil.copytree(C.config_dir(), dst)
    monkeypatch.setenv("QLABENCH_CONFIG_DIR", str(dst))
    return dst


def test_malformed_toml_names_file(config_copy):
    (config_copy / "heads.toml").write_text("[presets.hk2_hv8\nh_qk = 2\n")
    with pytest.raises(C.ConfigError, match="heads.toml: malformed TOML"):
        C.load_presets()


def test_bad_pattern_in_file_names_key(config_copy):
    text = (config_copy / "seqlens.toml").read_text().replace('"1x2048"', '"1x20x48"')
    (config_copy / "seqlens.toml").write_text(text)
    with pytest.raises(C.ConfigError, match=r"seqlens.toml: sets.fwd.patterns: .*'1x20x48'"):
        C.load_seqlens()


def test_bad_sweep_key_and_value(config_copy):
    (config_copy / "sweeps" / "mine.toml").write_text('presets = ["hk2_hv4"]\nphase = ["fwd"]\n')
    with pytest.raises(C.ConfigError, match=r"mine.toml: unknown keys \['phase'\]"):
        C.load_sweep("mine")
    (config_copy / "sweeps" / "mine.toml").write_text('presets = ["hk2_hv4"]\nseqlens = ["1x4096", "2x"]\n')
    with pytest.raises(C.ConfigError, match=r"mine.toml: seqlens: .*'2x'"):
        C.load_sweep("mine")
    (config_copy / "heads.toml").write_text('[presets.hk2_hv8]\nh_qk = 2\nh_v = "8"\n')
    with pytest.raises(C.ConfigError, match=r"presets.hk2_hv8.h_v must be an int"):
        C.load_presets()


def test_missing_config_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("QLABENCH_CONFIG_DIR", str(tmp_path / "absent"))
    with pytest.raises(C.ConfigError, match="QLABENCH_CONFIG_DIR"):
        C.config_dir()
