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
