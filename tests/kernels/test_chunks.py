"""Chunk tables built on the device from cu_seqlens (shared by the forward and the backward)."""

from __future__ import annotations

import torch

from qlabench.kernels.common.chunks import build_chunk_table, dense_cu_seqlens, max_chunks


def test_chunk_tables_cover_every_token_once():
    cu = torch.tensor([0, 1, 34, 97, 161, 226, 226, 250], dtype=torch.int32)
    t = build_chunk_table(cu, 260, 64)
    assert t.chunk_offsets.tolist() == [0, 1, 2, 3, 4, 6, 6, 7]
    assert t.n_chunks_max == max_chunks(260, 7, 64) == 5 + 7
    real = t.chunk_bounds[: t.chunk_offsets[-1]].tolist()
    assert real == [[0, 1], [1, 34], [34, 97], [97, 161], [161, 225], [225, 226], [226, 250]]
    assert (t.chunk_bounds[t.chunk_offsets[-1]:] == 0).all()
    assert t.cu_seqlens.dtype == torch.int32 and t.cu_seqlens.tolist() == cu.tolist()


def test_dense_layout_is_B_sequences_of_T():
    cu = dense_cu_seqlens(3, 100, "cpu")
    assert cu.tolist() == [0, 100, 200, 300]
    t = build_chunk_table(cu, 300, 64)
    assert t.chunk_offsets.tolist() == [0, 2, 4, 6]
    assert t.chunk_bounds[:6].tolist() == [[0, 64], [64, 100], [100, 164], [164, 200], [200, 264], [264, 300]]


def test_chunk_table_cache_by_host_bounds(monkeypatch):
    import qlabench.kernels.common.chunks as ch
    from qlabench.kernels.validate import sequence_bounds

    monkeypatch.setattr(ch, "_TABLES", ch.OrderedDict())
    monkeypatch.setattr(ch, "_PINNED", set())
    cu = torch.tensor([0, 100, 260], dtype=torch.int32)
    t1 = ch.chunk_table(cu, sequence_bounds(cu, 1, 300), 1, 300, 64, "cpu")
    ref = build_chunk_table(cu, 300, 64)
    for a, b in ((t1.cu_seqlens, ref.cu_seqlens), (t1.chunk_offsets, ref.chunk_offsets),
                 (t1.chunk_bounds, ref.chunk_bounds)):
        assert torch.equal(a, b)
    assert ch.chunk_table(cu.clone(), sequence_bounds(cu, 1, 300), 1, 300, 64, "cpu") is t1  # same values
    cu[1] = 120  # the same tensor, new values: new bounds, new table
    t2 = ch.chunk_table(cu, sequence_bounds(cu, 1, 300), 1, 300, 64, "cpu")
    assert t2 is not t1 and int(t2.chunk_bounds[1, 0]) == 64 and int(t2.chunk_bounds[2, 0]) == 120
    assert t1.cu_seqlens.tolist() == [0, 100, 260]  # the cached table owns its tensors
    # dense input: the table of [0, T, 2T]
    td = ch.chunk_table(None, sequence_bounds(None, 2, 100), 2, 100, 64, "cpu")
    assert td.cu_seqlens.tolist() == [0, 100, 200] and td.chunk_offsets.tolist() == [0, 2, 4]
    # no host bounds (a capture of an unseen tensor): built, not cached
    n = len(ch._TABLES)
    ch.chunk_table(cu, None, 1, 300, 64, "cpu")
    assert len(ch._TABLES) == n


def test_chunk_table_cache_evicts_oldest_but_not_pinned(monkeypatch):
    import qlabench.kernels.common.chunks as ch

    monkeypatch.setattr(ch, "_TABLES", ch.OrderedDict())
    monkeypatch.setattr(ch, "_PINNED", set())
    monkeypatch.setattr(ch, "MAX_TABLES", 2)
    bounds = [((0, 64 * i),) for i in range(1, 5)]
    first = ch.chunk_table(None, bounds[0], 1, 64, 64, "cpu")
    ch._PINNED.add((bounds[0], 64, 64, "cpu"))  # as if used by a captured graph
    for b in bounds[1:]:
        ch.chunk_table(None, b, 1, b[0][1], 64, "cpu")
    keys = list(ch._TABLES)
    assert (bounds[0], 64, 64, "cpu") in keys and len(keys) == 2
    assert ch.chunk_table(None, bounds[0], 1, 64, 64, "cpu") is first


def test_table_knows_where_the_padding_tail_starts(monkeypatch):
    import qlabench.kernels.common.chunks as ch
    from qlabench.kernels.validate import sequence_bounds

    monkeypatch.setattr(ch, "_TABLES", ch.OrderedDict())
    cu = torch.tensor([0, 100, 260], dtype=torch.int32)
    assert ch.chunk_table(cu, sequence_bounds(cu, 1, 300), 1, 300, 64, "cpu").tokens_end == 260
    assert ch.chunk_table(None, sequence_bounds(None, 2, 100), 2, 100, 64, "cpu").tokens_end == 200
    assert ch.chunk_table(cu, None, 1, 300, 64, "cpu").tokens_end is None
    assert build_chunk_table(cu, 300, 64).tokens_end is None
