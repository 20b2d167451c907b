"""Config files -> presets, seqlen sets, sweeps, cases (qlabench/config.py)."""

from __future__ import annotations

import shutil

import pytest

from qlabench import config as C
from qlabench.workload import Pattern, parse_pattern

QWEN = {"hk2_hv8": (2, 8), "hk4_hv16": (4, 16), "hk8_hv32": (8, 32), "hk16_hv64": (16, 64),
        "hk16_hv32": (16, 32), "hk8_hv24": (8, 24), "hk16_hv48": (16, 48), "hk16_hv16": (16, 16),
        "hk32_hv32": (32, 32)}


def test_presets_hold_flashqla_qwen_set():
    presets = C.load_presets()
    for name, (hq, hv) in QWEN.items():
        assert (presets[name].h_qk, presets[name].h_v) == (hq, hv)
    assert presets["hk2_hv8"].model == "397B/122B TP8"
    assert presets["hk32_hv32"].model == "Sym h32"


def test_stress_presets_are_listed():
    presets = C.load_presets()
    assert presets["hk1_hv1"] == C.Preset("hk1_hv1", 1, 1, "stress: one head")
    assert presets["hk4_hv4"] == C.Preset("hk4_hv4", 4, 4, "stress: 4 heads")
    assert C.resolve_preset("hk1_hv1").model == "stress: one head"


@pytest.mark.parametrize("name,hq,hv", [("hk3_hv9", 3, 9), ("hk1_hv3", 1, 3), ("hk64_hv128", 64, 128)])
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


def test_stress_sweep_axes():
    sw = C.load_sweep("stress")
    cases = sw.cases
    assert sw.arch == "sm90" and sw.phases == ["fwd", "bwd"] and sw.backends == ["qla", "fla", "flash_qla"]
    assert len(cases) == 128 and len({c.label for c in cases}) == 128
    assert [c.phase for c in cases].count("fwd") == [c.phase for c in cases].count("bwd") == 64
    assert {c.gate_profile for c in cases} == {"bench", "qwen", "extreme", "qwen_strong_last"}
    assert {c.beta_profile for c in cases} == {"sigmoid", "near0", "near1"}
    assert {c.h0_scale for c in cases} == {1.0, 100.0}
    assert max(c.preset.h_v // c.preset.h_qk for c in cases) == 8
    long = sorted({c.pattern.total_tokens for c in cases if c.preset.name == "hk2_hv8" and not c.pattern.pad})
    assert long == [8192, 16384, 32768, 65536, 131072, 262144]
    # issue #20: one strongly decaying v-head among 1, 4 or 8, short varlen batches with a padding tail,
    # h0 (the sweep default): 12 input sets per phase, each pattern its own seed
    few = [c for c in cases if c.gate_profile == "qwen_strong_last"]
    assert len(few) == 24 and {c.preset.name for c in few} == {"hk1_hv1", "hk4_hv4", "hk2_hv8"}
    assert {(c.beta_profile, c.h0_scale) for c in few} == {("sigmoid", 1.0)}
    for phase in ("fwd", "bwd"):
        sets = {(c.preset.name, c.pattern.name) for c in few if c.phase == phase}
        assert len(sets) == 12
    patterns = {c.pattern for c in few}
    assert len(patterns) == 4 and "300+1+64+129+65+pad37" in {p.name for p in patterns}
    for p in patterns:
        assert p.pad > 0 and 1 <= min(p.seqlens) and max(p.seqlens) <= 300 and p.n_seqs >= 5
        assert any(n % 64 for n in p.seqlens)  # a partial chunk
    assert parse_pattern("300+1+64+129+65+pad37") == Pattern("300+1+64+129+65+pad37", (300, 1, 64, 129, 65), 37)
    padded = next(c.pattern for c in cases if c.pattern.pad)
    assert padded.pad == 1000 and padded.seqlens.count(1) == 256
    assert padded.seqlens.count(63) == 64 and padded.seqlens.count(65) == 64
    assert any(c.pattern.seqlens == (1,) * 512 for c in cases)
    # grouped per preset: each preset's cases are consecutive
    order = [c.preset.name for c in cases]
    assert order == sorted(order, key=order.index)
    assert cases[0].label == "fwd-hk2_hv16-1x8192-qwen"
    assert any(c.label == "bwd-hk2_hv16-1x8192-qwen-beta=near1" for c in cases)
    assert any(c.label == "fwd-hk2_hv16-512*1-bench-h0x100" for c in cases)


GROUPED = '''
presets = ["hk2_hv4"]
phases = ["fwd"]
[[groups]]
seqlens = ["1x64"]
gate_profile = ["qwen", "extreme"]
[[groups]]
presets = ["hk1_hv2", "hk2_hv4"]
seqlens = ["2*3+pad5"]
beta_profile = "near1"
h0_scale = [1, 10]
'''


def test_sweep_groups_are_a_union_of_cross_products(config_copy):
    (config_copy / "sweeps" / "mine.toml").write_text(GROUPED)
    sw = C.load_sweep("mine")
    got = [(c.preset.name, c.pattern.name, c.gate_profile, c.beta_profile, c.h0_scale) for c in sw.cases]
    assert got == [
        ("hk2_hv4", "1x64", "qwen", "sigmoid", 1.0), ("hk2_hv4", "1x64", "extreme", "sigmoid", 1.0),
        ("hk2_hv4", "2*3+pad5", "bench", "near1", 1.0), ("hk2_hv4", "2*3+pad5", "bench", "near1", 10.0),
        ("hk1_hv2", "2*3+pad5", "bench", "near1", 1.0), ("hk1_hv2", "2*3+pad5", "bench", "near1", 10.0),
    ]
    assert sw.cases[2].pattern.pad == 5 and sw.cases[3].label == "fwd-hk2_hv4-2*3+pad5-bench-beta=near1-h0x10"


def test_qwen_strong_last_in_a_sweep_and_as_the_gate_option(config_copy):
    (config_copy / "sweeps" / "mine.toml").write_text(
        'presets = ["hk1_hv1", "hk4_hv4"]\nphases = ["bwd"]\nseqlens = ["5+1+pad2"]\ngate_profile = "qwen_strong_last"\n')
    sw = C.load_sweep("mine")
    assert [(c.preset.model, c.gate_profile, c.label) for c in sw.cases] == [
        ("stress: one head", "qwen_strong_last", "bwd-hk1_hv1-5+1+pad2-qwen_strong_last"),
        ("stress: 4 heads", "qwen_strong_last", "bwd-hk4_hv4-5+1+pad2-qwen_strong_last")]
    assert C.check_gate_profile("qwen_strong_last") == "qwen_strong_last"
    from qlabench import runsetup as RS

    sel = RS.select_cases("h200-fwd", seqlens="1x64", gate_profile="qwen_strong_last")
    assert len(sel.cases) == 9 and sel.gate_profile == "qwen_strong_last"
    sel = RS.select_cases(cfgs="hk1_hv1", seqlens="1x64", gate_profile="qwen_strong_last")
    assert [c.gate_profile for c in sel.cases] == ["qwen_strong_last"]


@pytest.mark.parametrize("text,match", [
    (GROUPED.replace('beta_profile = "near1"', 'gate = "qwen"'), r"groups\[1\] has unknown keys \['gate'\]"),
    (GROUPED.replace('"near1"', '"near2"'), r"groups\[1\]\.beta_profile: unknown beta profile 'near2'"),
    (GROUPED.replace("[1, 10]", "[1, 0]"), r"groups\[1\]\.h0_scale: h0_scale must be a positive"),
    (GROUPED.replace("[1, 10]", '"big"'), r"groups\[1\]\.h0_scale: .*'big'"),
    (GROUPED.replace('"extreme"', '"hard"'), r"groups\[0\]\.gate_profile: unknown gate profile 'hard'"),
    (GROUPED.replace('presets = ["hk2_hv4"]\n', ""), r"missing key 'groups\[0\]\.presets'"),
    ('presets = ["hk2_hv4"]\ngroups = 3\n', "groups must be one or more"),
    ('presets = ["hk2_hv4"]\nbeta_profile = ["near0", "sigmoid"]\nh0_scale = true\n', r"h0_scale: .*True"),
])
def test_bad_group_keys_name_the_group(config_copy, text, match):
    (config_copy / "sweeps" / "mine.toml").write_text(text)
    with pytest.raises(C.ConfigError, match=match):
        C.load_sweep("mine")


def test_options_replace_parts_of_a_sweep():
    from qlabench import runsetup as RS

    # a plain sweep: the cross product the options name, as before [[groups]] existed
    sel = RS.select_cases("h200-bwd", cfgs="hk2_hv4", phase="fwd,bwd")
    assert [c.phase for c in sel.cases].count("fwd") == 19 and [c.phase for c in sel.cases].count("bwd") == 8
    assert {c.preset.name for c in sel.cases} == {"hk2_hv4"} and sel.gate_profile == "bench"
    sel = RS.select_cases("h200-fwd", seqlens="1x4096", gate_profile="qwen")
    assert len(sel.cases) == 9 and {c.gate_profile for c in sel.cases} == {"qwen"}
    # a grouped sweep: no option -> its cases; options keep the groups' pairings
    stress = C.load_sweep("stress").cases
    sel = RS.select_cases("stress")
    assert sel.cases == stress and sel.gate_profile == "qwen,extreme,bench,qwen_strong_last"
    fwd = RS.select_cases("stress", phase="fwd").cases
    assert fwd == [c for c in stress if c.phase == "fwd"]
    one = RS.select_cases("stress", cfgs="hk4_hv8").cases
    assert {c.preset.name for c in one} == {"hk4_hv8"}
    assert len(one) == len({(c.phase, c.pattern, c.gate_profile, c.beta_profile, c.h0_scale) for c in stress})
    short = RS.select_cases("stress", seqlens="1x64").cases
    assert {c.pattern.name for c in short} == {"1x64"}
    assert len(short) == len({(c.phase, c.preset, c.gate_profile, c.beta_profile, c.h0_scale) for c in stress})
    bench = RS.select_cases("stress", gate_profile="bench").cases
    assert {c.gate_profile for c in bench} == {"bench"} and len(bench) < len(stress)
