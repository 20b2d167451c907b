"""`qlabench run | list | env` through click's CliRunner, on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

from qlabench import results as R

from .clitools import invoke as _invoke

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_run_quick_cpu(tmp_path):
    out = tmp_path / "r.json"
    res = _invoke("run", "--cfg", "hk2_hv4", "--quick", "--device", "cpu", "--out", str(out), "--no-progress")
    assert res.exit_code == 0, res.output
    assert "CPU reference timings (not GPU kernel figures)" in res.output
    assert "FORWARD" in res.output
    # rows say the lengths they ran (the name stays the row's identity), no speedup header without a
    # peer, no first-call section unless --verbose
    assert "1x512 (of 1x32768)" in res.output and "128x4 (of 8192x4)" in res.output
    assert "speedup = peer time" not in res.output and "no peer backend" in res.output
    assert "FIRST CALL" not in res.output
    data = R.load(out)
    rows = data["rows"]
    assert len(rows) == 19 and {r["status"] for r in rows} == {"ok"}
    assert {r["backend"] for r in rows} == {"torch"}
    for r in rows:
        assert r["median_ms"] > 0 and r["samples"] == 5 and r["total_tokens"] <= 512
        assert r["h_qk"] == 2 and r["h_v"] == 4 and r["timer"] == "wall"
    run = data["run"]
    assert run["quick"] is True and run["warmup"] == 1 and run["repeats"] == 5 and run["phases"] == ["fwd"]
    assert run["backends"] == ["torch"] and data["env"]["device"] == "cpu"
    # resume: nothing left to do, the file keeps its rows
    again = _invoke("run", "--cfg", "hk2_hv4", "--quick", "--device", "cpu", "--out", str(out), "--resume",
                    "--no-progress")
    assert again.exit_code == 0 and len(R.load(out)["rows"]) == 19
    # no --resume on an existing file: refused, exit 2
    refused = _invoke("run", "--cfg", "hk2_hv4", "--quick", "--device", "cpu", "--out", str(out))
    assert refused.exit_code == 2 and "already exists" in refused.output


def test_run_cpu_default_out_is_ignored_runs_folder_and_verbose(tmp_path, monkeypatch):
    """Without --out a CPU run writes runs/cpu/<date>_<commit>/ (git-ignored), not results/; --verbose
    adds the first-call section."""
    monkeypatch.chdir(tmp_path)
    res = _invoke("run", "--cfg", "hk1_hv2", "--seqlens", "1x1024", "--quick", "--device", "cpu", "--no-progress",
                  "--verbose")
    assert res.exit_code == 0, res.output
    (path,) = (tmp_path / "runs" / "cpu").glob("*/hk1_hv2_fwd_quick.json")
    assert not (tmp_path / "results").exists() and len(R.load(path)["rows"]) == 1
    assert "FIRST CALL" in res.output and "1x512 (of 1x1024)" in res.output
    from pathlib import Path

    ignore = (Path(__file__).resolve().parents[1] / ".gitignore").read_text().split()
    assert "/runs/" in ignore


def test_run_bwd_patterns_and_backends(tmp_path):
    out = tmp_path / "b.json"
    res = _invoke("run", "--cfg", "hk1_hv2", "--seqlens", "1x4096,8k_2seq", "--phase", "bwd", "--device", "cpu",
                  "--quick", "--backends", "torch,fla", "--out", str(out), "--no-progress", "--gate-profile", "qwen")
    assert res.exit_code == 0, res.output
    rows = R.load(out)["rows"]
    status = {(r["pattern"], r["backend"]): r["status"] for r in rows}
    assert status == {("1x4096", "torch"): "ok", ("1x4096", "fla"): "unavailable",
                      ("8k_2seq", "torch"): "ok", ("8k_2seq", "fla"): "unavailable"}
    assert all(r["gate_profile"] == "qwen" and r["phase"] == "bwd" for r in rows)


@CPU_ONLY
def test_arch_without_gpu_exits_2():
    res = _invoke("run", "--arch", "sm90", "--cfg", "hk16_hv16")
    assert res.exit_code == 2
    assert "--arch sm90" in res.output and "no CUDA GPU" in res.output
    assert "Traceback" not in res.output
    res = _invoke("run", "--arch", "sm90", "--cfg", "hk16_hv16", "--device", "cpu")
    assert res.exit_code == 2 and "--arch sm90" in res.output


@CPU_ONLY
def test_no_gpu_without_quick_or_device_exits_2():
    res = _invoke("run", "--cfg", "hk16_hv16")
    assert res.exit_code == 2 and "--device cpu" in res.output


@pytest.mark.parametrize("args,needle", [
    (["--cfg", "hk3_hv8"], "hk3_hv8"),
    (["--cfg", "hk2_hv4", "--seqlens", "1x4096,12y"], "'12y'"),
    (["--cfg", "hk2_hv4", "--phase", "sideways"], "sideways"),
    (["--cfg", "hk2_hv4", "--backends", "torch,warp"], "'warp'"),
    (["--sweep", "nope"], "unknown sweep 'nope'"),
    ([], "--cfg"),
])
def test_bad_options_exit_2_with_message(args, needle, tmp_path):
    res = _invoke("run", "--device", "cpu", "--quick", "--out", str(tmp_path / "x.json"), *args)
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output
    assert not (tmp_path / "x.json").exists()


def test_malformed_config_file_exit_2(tmp_path, monkeypatch):
    import shutil

    from qlabench.config import config_dir

    dst = tmp_path / "configs"
    shutil.copytree(config_dir(), dst)
    (dst / "sweeps" / "broken.toml").write_text("presets = [\"hk2_hv4\"\n")
    monkeypatch.setenv("QLABENCH_CONFIG_DIR", str(dst))
    res = _invoke("run", "--sweep", "broken", "--device", "cpu", "--quick", "--out", str(tmp_path / "x.json"))
    assert res.exit_code == 2 and "broken.toml: malformed TOML" in res.output


def test_list_commands():
    res = _invoke("list", "configs")
    assert res.exit_code == 0 and "hk16_hv64" in res.output and "397B/122B TP1" in res.output
    res = _invoke("list", "seqlens")
    assert res.exit_code == 0 and "32k_4seq" in res.output and "7212,7072,13725,4759" in res.output
    res = _invoke("list", "sweeps")
    assert res.exit_code == 0 and "h200-fwd" in res.output and "171 cases" in res.output
    res = _invoke("list", "backends", "--device", "cpu")
    assert res.exit_code == 0
    assert "torch      available" in res.output and "fla        unavailable:" in res.output


def test_env_command():
    res = _invoke("env", "--json")
    assert res.exit_code == 0
    env = json.loads(res.output)
    assert env["versions"]["torch"] == torch.__version__ and "timestamp" in env
    assert _invoke("env").exit_code == 0


def test_run_help_documents_defaults():
    text = _invoke("run", "--help").output
    for opt in ("--arch", "--cfg", "--sweep", "--seqlens", "--phase", "--backends", "--gate-profile", "--device",
                "--quick", "--out", "--resume", "--seed", "--warmup", "--repeats", "--timer"):
        assert opt in text
    assert text.count("default") >= 14
