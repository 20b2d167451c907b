"""Kernel variants as backends (`qla:cp=on+bwd_dh=ws`), kernel options in rows and row identity, and
`run --kernel-split`, on the CPU."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from qlabench import results as R
from qlabench.backends import canonical_name, get_backend, parse_backends
from qlabench.cli import main
from qlabench.kernels.options import ENV_VARS, RETIRED, KernelOptions
from qlabench.report.synthetic import make_results, make_row

DEFAULT = KernelOptions().as_dict()


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for var in (*ENV_VARS.values(), *(r.env for r in RETIRED.values())):
        monkeypatch.delenv(var, raising=False)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# --- names -----------------------------------------------------------------------------------------


def test_variant_names_are_canonical():
    assert parse_backends("qla,fla,qla:bwd_dh=ws+cp=on,qla:cp=auto,torch") == [
        "qla", "fla", "qla:cp=on+bwd_dh=ws", "torch"]
    assert parse_backends(["qla:fwd_kernel=wy", "qla:fwd_kernel=wy"]) == ["qla:fwd_kernel=wy"]
    assert canonical_name("qla:fwd_kernel=pipelined+cp=off") == "qla:cp=off+fwd_kernel=pipelined"


def test_variant_backend_carries_its_options():
    b = get_backend("qla:bwd_dh=ws+cp=on")
    assert b.name == "qla:cp=on+bwd_dh=ws"
    assert b.options == KernelOptions(cp="on", bwd_dh="ws")
    assert b.options_record() == {**DEFAULT, "cp": "on", "bwd_dh": "ws"}
    assert get_backend("qla").options_record() == DEFAULT
    assert get_backend("torch").options_record() is None and get_backend("fla").options_record() is None


@pytest.mark.parametrize("spec, match", [
    ("qla:cp=maybe", r"backend 'qla:cp=maybe': kernel option cp must be one of auto, on, off, got 'maybe'"),
    ("qla:speed=fast", r"backend 'qla:speed=fast': unknown kernel option 'speed'; known: cp, fwd_kernel"),
    ("qla:cp", r"backend 'qla:cp': kernel option 'cp' needs key=value"),
    ("qla:kkt=grouped", r"backend 'qla:kkt=grouped': kernel option kkt \(QLABENCH_KKT\) was removed in session 8"),
    ("fla:cp=on", r"backend 'fla:cp=on': backend 'fla' takes no options"),
    ("qlb:cp=on", r"unknown backend 'qlb'; known: qla, fla, flash_qla, flashinfer, torch"),
])
def test_bad_variants_name_the_key_and_value(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_backends(f"torch,{spec}")


def test_environment_switches_become_the_name(monkeypatch):
    """The suite reads QLABENCH_* once, at parse_backends: plain qla under QLABENCH_CP=on is
    `qla:cp=on`, so its rows never pass for the default kernels; options in the name win."""
    monkeypatch.setenv("QLABENCH_CP", "on")
    monkeypatch.setenv("QLABENCH_BWD_DH", "ws")
    assert parse_backends("qla,torch,qla:cp=auto") == ["qla:cp=on+bwd_dh=ws", "torch", "qla:bwd_dh=ws"]
    assert get_backend("qla").name == "qla"  # a backend built from a name reads no environment
    monkeypatch.setenv("QLABENCH_CP", "bogus")
    with pytest.raises(ValueError, match="QLABENCH_CP must be one of auto, on, off, got 'bogus'"):
        parse_backends("qla")
    monkeypatch.setenv("QLABENCH_CP", "on")
    monkeypatch.setenv("QLABENCH_KKT", "grouped")  # a removed option's switch
    with pytest.raises(ValueError, match=r"kernel option kkt \(QLABENCH_KKT\) was removed in session 8"):
        parse_backends("qla")
    assert parse_backends("torch") == ["torch"]  # only qla reads the switches


def test_qla_backend_passes_its_options(monkeypatch):
    import qlabench.kernels as K

    seen = {}
    monkeypatch.setattr(K, "chunk_gated_delta_rule", lambda *a, **kw: seen.update(kw) or ("o", "ht"))

    class W:
        q = k = v = g = beta = h0 = cu_seqlens = None
        scale = 1.0

    assert get_backend("qla:fwd_kernel=wy").forward(W()) == ("o", "ht")
    assert seen["options"] == KernelOptions(fwd_kernel="wy")


# --- rows and identity -----------------------------------------------------------------------------


def _qla_row(backend="qla", options=None, median=1.0, pattern="1x4096"):
    r = make_row("fwd", 16, 16, pattern, backend, median)
    if options is not None:
        r["options"] = options
    return r


def test_options_are_part_of_row_identity():
    plain = _qla_row(options=DEFAULT)
    old = _qla_row()  # a file from before options: the default kernels
    cp = _qla_row("qla:cp=on", {**DEFAULT, "cp": "on"})
    assert R.row_key(plain) == R.row_key(old) != R.row_key(cp)
    assert R.backend_key(cp) == "qla:cp=on" and R.backend_key(plain) == "qla"
    assert R.row_key(cp)[-1] == "qla:cp=on"
    R.validate(make_results([plain, cp]))  # two variants of one case: two rows
    with pytest.raises(R.ResultsError, match="same case and backend"):
        R.validate(make_results([plain, old]))


def test_a_name_that_hides_its_options_is_refused():
    with pytest.raises(R.ResultsError, match=r"backend = 'qla'.*its options say 'qla:cp=on'"):
        R.validate(make_results([_qla_row("qla", {**DEFAULT, "cp": "on"})]))
    with pytest.raises(R.ResultsError, match=r"options.*unknown kernel option 'turbo'"):
        R.validate(make_results([_qla_row("qla", {"turbo": "on"})]))
    with pytest.raises(R.ResultsError, match=r"options"):
        R.validate(make_results([_qla_row("qla", ["cp=on"])]))


def test_gate_never_compares_two_variants(tmp_path):
    """A baseline of the default qla and a run of qla:cp=on share no row: the gate cannot compare them
    (exit 2) instead of comparing two kernels under one name; an old file without options is the
    default qla."""
    base = tmp_path / "base.json"
    cur = tmp_path / "cur.json"
    base.write_text(json.dumps(make_results([_qla_row(options=DEFAULT)])))
    cur.write_text(json.dumps(make_results([_qla_row("qla:cp=on", {**DEFAULT, "cp": "on"}, median=0.5)])))
    res = CliRunner().invoke(main, ["gate", str(cur), "--baseline", str(base)])
    assert res.exit_code == 2, res.output
    assert "no common rows" in res.output
    same = tmp_path / "same.json"
    same.write_text(json.dumps(make_results([_qla_row(median=1.0)])))  # old file, no options: defaults
    ok = CliRunner().invoke(main, ["gate", str(same), "--baseline", str(base)])
    assert ok.exit_code == 0, ok.output


# --- run -------------------------------------------------------------------------------------------


def _run(tmp_path, *extra):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["run", "--cfg", "hk1_hv2", "--seqlens", "1x64", "--quick", "--device", "cpu",
                                    "--out", str(out), "--no-progress", *extra], catch_exceptions=False)
    return res, out


def test_run_records_variant_columns_and_options(tmp_path):
    res, out = _run(tmp_path, "--backends", "torch,qla,qla:bwd_dh=ws+cp=on")
    assert res.exit_code == 0, res.output
    data = R.load(out)
    assert data["run"]["backends"] == ["torch", "qla", "qla:cp=on+bwd_dh=ws"]
    by = {r["backend"]: r for r in data["rows"]}
    assert by["torch"]["options"] is None and by["torch"]["status"] == "ok"
    assert by["qla"]["status"] == "unavailable" and by["qla"]["options"] == DEFAULT
    assert by["qla:cp=on+bwd_dh=ws"]["options"] == {**DEFAULT, "cp": "on", "bwd_dh": "ws"}
    assert "qla:cp=on+bwd_dh=ws" in res.output  # its own column in the end-of-run table


def test_run_rejects_a_bad_variant(tmp_path):
    res, out = _run(tmp_path, "--backends", "torch,qla:bwd_dh=fast")
    assert res.exit_code == 2
    assert "bwd_dh must be one of auto, ws, pipelined, fused, got 'fast'" in res.output
    assert not out.exists()


def test_run_kernel_split_on_cpu(tmp_path):
    """--kernel-split profiles the timed calls (the CPU operators' self time here) into each row, and
    the report shows the section."""
    res, out = _run(tmp_path, "--backends", "torch", "--kernel-split")
    assert res.exit_code == 0, res.output
    data = R.load(out)
    assert data["run"]["kernel_split"] is True
    (row,) = data["rows"]
    split = row["kernel_split"]
    assert split and all(v > 0 for v in split.values())
    assert list(split.values()) == sorted(split.values(), reverse=True)
    assert any(k.startswith("aten::") for k in split)
    rep = CliRunner().invoke(main, ["report", str(out), "--format", "md"])
    assert rep.exit_code == 0, rep.output
    assert "Per-kernel split" in rep.output
    plain, out2 = _run(tmp_path / "b", "--backends", "torch")
    assert plain.exit_code == 0 and R.load(out2)["rows"][0]["kernel_split"] is None


def test_env_block_records_the_kernel_switches(tmp_path, monkeypatch):
    """QLABENCH_WS_AUTO_SYNC is no option (the kernel factories read it while compiling): the env block
    records it, and every other kernel switch, as set."""
    from qlabench.envinfo import KERNEL_SWITCHES, kernel_switches

    assert set(ENV_VARS.values()) < set(KERNEL_SWITCHES)
    assert kernel_switches({"QLABENCH_WS_AUTO_SYNC": "1", "PATH": "/bin"}) == {"QLABENCH_WS_AUTO_SYNC": "1"}
    monkeypatch.setenv("QLABENCH_WS_AUTO_SYNC", "1")
    res, out = _run(tmp_path, "--backends", "torch")
    assert res.exit_code == 0, res.output
    assert R.load(out)["env"]["kernel_switches"] == {"QLABENCH_WS_AUTO_SYNC": "1"}


def test_names_are_relative_to_the_defaults_their_file_records():
    """`qla` is the default kernels of the run's commit: a file records those defaults
    (run.option_defaults); a file from before the record (cp's default was off then) names a cp=off row
    `qla`, today's runs name it `qla:cp=off`. Both load; within one file a name hiding its options is
    refused; --resume refuses a file whose defaults differ."""
    old_doc = make_results([_qla_row("qla", {**DEFAULT, "cp": "off"})])
    del old_doc["run"]["option_defaults"]
    R.validate(old_doc)
    assert R.option_defaults(old_doc["run"]) == R.LEGACY_OPTION_DEFAULTS
    with pytest.raises(R.ResultsError, match=r"its options say 'qla:cp=off'"):
        R.validate(make_results([_qla_row("qla", {**DEFAULT, "cp": "off"})]))
    R.validate(make_results([_qla_row("qla:cp=off", {**DEFAULT, "cp": "off"})]))
    new_run = make_results([])["run"]
    with pytest.raises(R.ResultsError, match="option_defaults"):
        R.check_resume_settings(old_doc["run"], new_run, "old.json")
    R.check_resume_settings(new_run, dict(new_run), "new.json")


def test_files_with_the_retired_kkt_option_keep_their_rows(tmp_path):
    """Files written before kkt (kkt_solve_grouped) was removed hold "kkt": "default" in every qla row's
    options and in run.option_defaults: they load, their `qla` row has the identity of a `qla` row of a
    new file, and --resume continues them. A row of the removed variant keeps its stored name."""
    old_default = {"cp": "auto", "fwd_kernel": "auto", "kkt": "default", "bwd_dh": "auto", "bwd_cp": "auto"}
    old_doc = make_results([_qla_row("qla", old_default),
                            _qla_row("qla:cp=on", {**old_default, "cp": "on"}),
                            _qla_row("qla:kkt=grouped", {**old_default, "kkt": "grouped"}),
                            _qla_row("qla:cp=on+kkt=grouped+bwd_dh=ws",
                                     {**old_default, "cp": "on", "kkt": "grouped", "bwd_dh": "ws"})])
    old_doc["run"]["option_defaults"] = dict(old_default)
    R.validate(old_doc)
    assert R.option_defaults(old_doc["run"]) == DEFAULT
    new_doc = make_results([_qla_row("qla", DEFAULT), _qla_row("qla:cp=on", {**DEFAULT, "cp": "on"})])
    old_keys = [R.row_key(r) for r in old_doc["rows"]]
    assert old_keys[:2] == [R.row_key(r) for r in new_doc["rows"]]
    assert old_keys[2][-1] == "qla:kkt=grouped" and len(set(old_keys)) == 4
    R.check_resume_settings(old_doc["run"], new_doc["run"], "old.json")
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old_doc))
    rep = CliRunner().invoke(main, ["report", str(path), "--format", "text"])
    assert rep.exit_code == 0, rep.output
    assert "qla:kkt=grouped" in rep.output
    # the legacy files (no option_defaults: cp off) hold the key too
    legacy = make_results([_qla_row("qla", {**old_default, "cp": "off"})])
    del legacy["run"]["option_defaults"]
    assert R.row_key(R.validate(legacy)["rows"][0]) == R.row_key(new_doc["rows"][0])
    with pytest.raises(R.ResultsError, match=r"backend = 'qla'.*its options say 'qla:kkt=grouped'"):
        R.validate(make_results([_qla_row("qla", {**old_default, "kkt": "grouped"})]))
