"""compare verdicts and every gate exit code, on synthetic results."""

import json

import pytest
from click.testing import CliRunner

from qlabench.cli import main
from qlabench.gate import (
    CompareError,
    compare,
    gate,
    parse_min_speedup,
    parse_percent,
    verdict,
)
from qlabench.report.synthetic import make_results, make_row


def _row(backend, ms, spread=0.01, pattern="1x32768", status="ok", phase="fwd"):
    return make_row(phase, 16, 16, pattern, backend, ms, status=status, spread=spread)


def _doc(rows, gpu="NVIDIA H200"):
    return make_results(rows, gpu_name=gpu)


def _write(tmp_path, name, doc):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


# ---- verdicts -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "base, cur, expected",
    [
        ((1.00, 0.01), (1.10, 0.01), "SLOWER"),  # clean 10% slowdown, tight ranges
        ((1.00, 0.01), (0.90, 0.01), "FASTER"),
        ((1.00, 0.01), (1.01, 0.01), "SAME"),  # under the 2% effect size
        ((1.00, 0.10), (1.10, 0.10), "NOISY"),  # 10% but p20-p80 ranges overlap
        ((1.00, 0.20), (1.015, 0.20), "SAME"),  # noisy and tiny: still SAME
    ],
)
def test_verdicts(base, cur, expected):
    b = _row("qla", base[0], spread=base[1])
    c = _row("qla", cur[0], spread=cur[1])
    import pandas as pd

    ratio, v = verdict(pd.Series(b), pd.Series(c))
    assert ratio == pytest.approx(cur[0] / base[0])
    assert v == expected


def test_compare_only_one_side_status_changes_and_geomean():
    base = _doc([_row("qla", 1.0), _row("fla", 3.0), _row("qla", 0.5, pattern="1x8192"),
                 _row("qla", 0.2, pattern="1x2048")])
    cur = _doc([_row("qla", 1.2), _row("fla", 3.0), _row("qla", 0.5, pattern="1x8192", status="incorrect"),
                _row("qla", 0.1, pattern="8192x4")])
    cmp = compare(base, cur)
    by = {p.label: p for p in cmp.pairs}
    assert by["fwd hk16_hv16 1x32768 [bench] qla"].verdict == "SLOWER"
    assert by["fwd hk16_hv16 1x32768 [bench] fla"].verdict == "SAME"
    changed = cmp.status_changes
    assert [(p.label, p.base_status, p.cur_status) for p in changed] == [
        ("fwd hk16_hv16 1x8192 [bench] qla", "ok", "incorrect")]
    assert cmp.only_base == ["fwd hk16_hv16 1x2048 [bench] qla"]
    assert cmp.only_current == ["fwd hk16_hv16 8192x4 [bench] qla"]
    assert cmp.geomean_ratio["qla"] == (pytest.approx(1.2), 1)
    assert cmp.geomean_ratio["fla"] == (pytest.approx(1.0), 1)


def test_compare_refuses_different_gpu():
    with pytest.raises(CompareError, match="different GPU models.*H100.*H200"):
        compare(_doc([_row("qla", 1.0)], gpu="NVIDIA H100 80GB HBM3"), _doc([_row("qla", 1.0)]))
    cmp = compare(_doc([_row("qla", 1.0)], gpu="NVIDIA H100 80GB HBM3"), _doc([_row("qla", 1.0)]),
                  allow_different_gpu=True)
    assert cmp.pairs[0].verdict == "SAME"


def test_parsers():
    r = parse_min_speedup("qla/fla=2.5")
    assert (r.subject, r.peer, r.ratio) == ("qla", "fla", 2.5)
    assert parse_min_speedup("qla/flash_qla=1.1x").ratio == 1.1
    with pytest.raises(ValueError, match="'qla-fla=2'"):
        parse_min_speedup("qla-fla=2")
    assert parse_percent("5%") == pytest.approx(0.05) and parse_percent("0.1") == pytest.approx(0.1)
    with pytest.raises(ValueError, match="'five'"):
        parse_percent("five")


# ---- gate exit codes, through the CLI --------------------------------------------------------------


@pytest.fixture
def files(tmp_path):
    base_rows = [_row("qla", 1.0), _row("fla", 3.0), _row("qla", 0.4, pattern="1x8192"),
                 _row("fla", 1.0, pattern="1x8192")]
    return {
        "base": _write(tmp_path, "base.json", _doc(base_rows)),
        "same": _write(tmp_path, "same.json", _doc([_row("qla", 1.01), _row("fla", 3.0),
                                                     _row("qla", 0.4, pattern="1x8192"),
                                                     _row("fla", 1.0, pattern="1x8192")])),
        "noisy": _write(tmp_path, "noisy.json", _doc([_row("qla", 1.08, spread=0.1), _row("fla", 3.0),
                                                       _row("qla", 0.4, pattern="1x8192"),
                                                       _row("fla", 1.0, pattern="1x8192")])),
        "slow": _write(tmp_path, "slow.json", _doc([_row("qla", 1.2), _row("fla", 3.0),
                                                     _row("qla", 0.4, pattern="1x8192"),
                                                     _row("fla", 1.0, pattern="1x8192")])),
        "small_slow": _write(tmp_path, "small.json", _doc([_row("qla", 1.03, spread=0.002), _row("fla", 3.0),
                                                            _row("qla", 0.4, pattern="1x8192"),
                                                            _row("fla", 1.0, pattern="1x8192")])),
        "wrong": _write(tmp_path, "wrong.json", _doc([_row("qla", 1.0, status="incorrect"), _row("fla", 3.0),
                                                       _row("qla", 0.4, pattern="1x8192"),
                                                       _row("fla", 1.0, pattern="1x8192")])),
        "h100": _write(tmp_path, "h100.json", _doc(base_rows, gpu="NVIDIA H100 80GB HBM3")),
        "other_cases": _write(tmp_path, "other.json", _doc([_row("qla", 1.0, pattern="8192x4"),
                                                             _row("fla", 2.0, pattern="8192x4")])),
        "not_results": _write(tmp_path, "junk.json", {"hello": "world"}),
    }


def _gate(*args):
    return CliRunner().invoke(main, ["gate", *args])


def test_gate_exit_0_when_same_or_noisy(files):
    r = _gate(files["same"], "--baseline", files["base"])
    assert r.exit_code == 0, r.output
    assert "GATE: PASS" in r.output
    r = _gate(files["noisy"], "--baseline", files["base"])  # +8% but within the run's dispersion
    assert r.exit_code == 0, r.output
    r = _gate(files["small_slow"], "--baseline", files["base"])  # confirmed +3% < 5% threshold
    assert r.exit_code == 0, r.output
    r = _gate(files["small_slow"], "--baseline", files["base"], "--max-regression", "2%")
    assert r.exit_code == 1, r.output


def test_gate_exit_1_on_regression_correctness_and_ratio(files):
    r = _gate(files["slow"], "--baseline", files["base"])
    assert r.exit_code == 1 and "+20.0%" in r.output and "GATE: FAIL" in r.output
    r = _gate(files["wrong"], "--baseline", files["base"])
    assert r.exit_code == 1 and "status incorrect" in r.output
    # in-run ratio: fla/qla = 3.0 and 2.5 -> geomean 2.74; needs no baseline
    r = _gate(files["same"], "--min-speedup", "qla/fla=2.5")
    assert r.exit_code == 0, r.output
    r = _gate(files["same"], "--min-speedup", "qla/fla=3")
    assert r.exit_code == 1 and "geomean 2.7" in r.output


def test_gate_exit_2_on_inputs_that_cannot_be_compared(files, tmp_path):
    r = _gate(files["not_results"], "--min-speedup", "qla/fla=2")
    assert r.exit_code == 2 and "schema" in r.output
    r = _gate(files["same"], "--baseline", files["not_results"])
    assert r.exit_code == 2
    r = _gate(files["same"], "--baseline", files["h100"])
    assert r.exit_code == 2 and "different GPU models" in r.output
    r = _gate(files["other_cases"], "--baseline", files["base"])
    assert r.exit_code == 2 and "no common rows" in r.output
    r = _gate(files["same"])
    assert r.exit_code == 2 and "nothing to gate" in r.output
    r = _gate(files["same"], "--min-speedup", "qla/flashinfer=2")
    assert r.exit_code == 2 and "'flashinfer'" in r.output
    r = _gate(files["same"], "--min-speedup", "qla=2")
    assert r.exit_code == 2 and "'qla=2'" in r.output
    r = _gate(str(tmp_path / "missing.json"), "--min-speedup", "qla/fla=2")
    assert r.exit_code == 2


def test_gate_api_direct(files):
    res = gate(files["slow"], files["base"], max_regression=0.25)
    assert res.code == 0
    with pytest.raises(CompareError):
        gate(files["same"], files["h100"])


def test_compare_cli(files):
    r = CliRunner().invoke(main, ["compare", files["base"], files["slow"]])
    assert r.exit_code == 0 and "SLOWER" in r.output and "qla: 1.095" in r.output
    r = CliRunner().invoke(main, ["compare", files["base"], files["h100"]])
    assert r.exit_code == 2 and "different GPU models" in r.output


def test_gate_merges_several_current_files(tmp_path):
    """qla measured in one file, its peer in another: gated together with --min-speedup; files of two
    GPU models are refused (exit 2)."""
    ours = _write(tmp_path, "qla.json", _doc([_row("qla", 1.0), _row("qla", 0.5, pattern="1x8192")]))
    peers = _write(tmp_path, "peers.json", _doc([_row("fla", 3.0), _row("fla", 1.5, pattern="1x8192")]))
    r = _gate(ours, peers, "--min-speedup", "qla/fla=2.5")
    assert r.exit_code == 0, r.output
    assert "geomean 3.000x over 2 cases" in r.output
    r = _gate(ours, peers, "--min-speedup", "qla/fla=3.5")
    assert r.exit_code == 1 and "geomean 3.000x" in r.output
    # a geomean just under the line is printed with the digit that shows it (2.997x, not 3.00x) and fails
    close = _write(tmp_path, "close.json", _doc([_row("fla", 2.9966), _row("fla", 1.4983, pattern="1x8192")]))
    r = _gate(ours, close, "--min-speedup", "qla/fla=3")
    assert r.exit_code == 1 and "geomean 2.997x" in r.output, r.output
    r = _gate(ours, "--min-speedup", "qla/fla=2.5")  # one file: the peer is not there
    assert r.exit_code == 2 and "'fla' is not in" in r.output
    other = _write(tmp_path, "b200.json", _doc([_row("fla", 3.0)], gpu="NVIDIA B200"))
    r = _gate(ours, other, "--min-speedup", "qla/fla=2.5")
    assert r.exit_code == 2 and "mixes GPUs" in r.output


def test_gate_every_case_ratio_and_peak_memory(tmp_path):
    """--min-case-speedup holds every case (not the geomean) to the ratio; --max-memory every case's peak memory
    ratio; each prints its worst case, and the parsers name the option in their errors."""
    ours = [_row("qla", 1.0), _row("qla", 0.5, pattern="1x8192")]
    peers = [_row("flash_qla", 1.5), _row("flash_qla", 0.35, pattern="1x8192")]  # ratios 1.5 and 0.7
    peers[0]["peak_mem_mb"], ours[0]["peak_mem_mb"] = 400.0, 480.0  # 1.2x
    peers[1]["peak_mem_mb"], ours[1]["peak_mem_mb"] = 100.0, 130.0  # 1.3x
    f = _write(tmp_path, "run.json", _doc(ours + peers))
    r = _gate(f, "--min-speedup", "qla/flash_qla=1")  # geomean 1.02: passes
    assert r.exit_code == 0, r.output
    r = _gate(f, "--min-case-speedup", "qla/flash_qla=0.8")
    assert r.exit_code == 1 and "worst 0.70x at fwd hk16_hv16 1x8192, 1 of 2 cases under 0.8x" in r.output, r.output
    r = _gate(f, "--min-case-speedup", "qla/flash_qla=0.7")
    assert r.exit_code == 0, r.output
    r = _gate(f, "--max-memory", "qla/flash_qla=1.25")
    assert r.exit_code == 1, r.output
    assert "largest 1.300x at fwd hk16_hv16 1x8192 (130.0 against 100.0 MiB), 1 of 2 cases over 1.25x" in r.output
    r = _gate(f, "--max-memory", "qla/flash_qla=1.3")
    assert r.exit_code == 0 and "0 of 2 cases over 1.3x" in r.output, r.output
    # a case without a recorded peak on one side is left out; none at all fails
    for row in ours:
        row["peak_mem_mb"] = None
    g = _write(tmp_path, "nomem.json", _doc(ours + peers))
    r = _gate(g, "--max-memory", "qla/flash_qla=1.25")
    assert r.exit_code == 1 and "recorded their peak memory" in r.output, r.output
    # the requirements alone are something to gate; a bad one names its option; a missing backend is exit 2
    r = _gate(f, "--max-memory", "qla-flash_qla=1.25")
    assert r.exit_code == 2 and "--max-memory must look like" in r.output and "'qla-flash_qla=1.25'" in r.output
    r = _gate(f, "--min-case-speedup", "qla/qla=1")
    assert r.exit_code == 2 and "--min-case-speedup needs two different backends" in r.output
    r = _gate(f, "--min-case-speedup", "qla/fla=1")
    assert r.exit_code == 2 and "'fla' is not in" in r.output
    res = gate(f, min_case_speedups=[parse_min_speedup("qla/flash_qla=0.5", "--min-case-speedup")],
               max_memory=[parse_min_speedup("qla/flash_qla=1.5", "--max-memory")])
    assert res.code == 0 and len(res.checks) == 3, res.render()
