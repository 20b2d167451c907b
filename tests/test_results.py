"""Results schema: atomic save, validating load, pandas view (qlabench/results.py)."""

from __future__ import annotations

import json
import math

import pytest

from qlabench import results as R

BASE = {
    "phase": "fwd", "preset": "hk2_hv8", "model": "397B/122B TP8", "h_qk": 2, "h_v": 8,
    "pattern": "1x4096", "seqlens": [4096], "total_tokens": 4096, "n_seqs": 1, "gate_profile": "bench",
    "dtype": "bfloat16", "backend": "fla", "status": "ok", "median_ms": 0.5, "p20_ms": 0.45,
    "p80_ms": 0.55, "min_ms": 0.4, "mean_ms": 0.5, "std_ms": 0.02, "samples": 100, "timer": "cudagraph",
    "l2_policy": "warm", "first_call_s": 12.5, "peak_mem_mb": 64.0,
    "errors": {"o": 0.004, "final_state": 0.002}, "backend_version": "0.6.0",
    "timestamp": "2026-11-29T00:00:00+00:00",
}


def _row(**kw):
    return R.make_row(**{**BASE, **kw})


def _results(rows):
    res = R.new_results({"gpu_name": "NVIDIA H200", "git_commit": "abc", "timestamp": "t0"},
                        {"argv": ["qlabench", "run"], "sweep": None})
    for r in rows:
        R.upsert_row(res, r)
    return res


def test_round_trip(tmp_path):
    res = _results([_row(), _row(backend="flash_qla", median_ms=0.2),
                    _row(backend="qla", status="unavailable", median_ms=None, p20_ms=None, p80_ms=None,
                         min_ms=None, mean_ms=None, std_ms=None, samples=None, message="not built")])
    path = R.save(res, tmp_path / "a" / "b.json")
    back = R.load(path)
    assert back == json.loads(json.dumps(res))
    assert back["schema"] == "qlabench.results/1"
    assert set(R.ROW_FIELDS) <= set(back["rows"][0])
    assert [p.name for p in path.parent.iterdir()] == ["b.json"]  # no temp file left


def test_upsert_replaces_same_key():
    res = _results([_row(status="error", median_ms=None, message="boom")])
    R.upsert_row(res, _row(median_ms=0.7))
    assert len(res["rows"]) == 1 and res["rows"][0]["median_ms"] == 0.7


def test_atomic_save_keeps_old_file_on_failure(tmp_path):
    path = tmp_path / "r.json"
    R.save(_results([_row()]), path)
    before = path.read_text()
    bad = _results([_row(extra=object())])
    with pytest.raises(TypeError):
        R.save(bad, path)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_non_finite_errors_stored_as_null(tmp_path):
    path = R.save(_results([_row(status="incorrect", errors={"o": math.nan, "final_state": math.inf})]),
                  tmp_path / "r.json")
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()
    assert R.load(path)["rows"][0]["errors"] == {"o": None, "final_state": None}


@pytest.mark.parametrize("mutate,msg", [
    (lambda d: d.update(schema="other/1"), "schema"),
    (lambda d: d.pop("env"), "env"),
    (lambda d: d["rows"][0].pop("median_ms"), "lacks fields"),
    (lambda d: d["rows"][0].update(status="great"), "status"),
    (lambda d: d["rows"][0].update(median_ms=None), "no median_ms"),
])
def test_load_rejects_invalid(tmp_path, mutate, msg):
    data = json.loads(json.dumps(_results([_row()])))
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(R.ResultsError, match=msg) as e:
        R.load(path)
    assert "bad.json" in str(e.value)


def test_load_missing_and_garbage(tmp_path):
    with pytest.raises(R.ResultsError, match="no such"):
        R.load(tmp_path / "nope.json")
    (tmp_path / "g.json").write_text("{not json")
    with pytest.raises(R.ResultsError, match="not valid JSON"):
        R.load(tmp_path / "g.json")


def test_make_row_checks_status():
    with pytest.raises(ValueError, match="maybe"):
        R.make_row(status="maybe")


def test_to_dataframe(tmp_path):
    a = R.save(_results([_row(), _row(backend="flash_qla", median_ms=0.25)]), tmp_path / "a.json")
    b = _results([_row(phase="bwd", pattern="32k_4seq", seqlens=[1, 2, 3, 4])])
    df = R.to_dataframe([a, b])
    assert len(df) == 3
    assert list(df.columns[: len(R.ROW_FIELDS)]) == list(R.ROW_FIELDS)
    assert df.loc[1, "median_ms"] == 0.25 and df.loc[0, "max_error"] == 0.004
    assert df.loc[2, "seqlens"] == [1, 2, 3, 4] and df.loc[2, "source"] == "<results 1>"
    assert df.loc[0, "source"] == str(a) and df.loc[0, "gpu_name"] == "NVIDIA H200"
    assert R.to_dataframe(_results([])).empty
