"""Chunk tables built on the device from cu_seqlens, without a host sync (CUDA-graph safe), and
cached by the sequences' host bounds.

Every sequence n of length L_n is cut into ceil(L_n / C) chunks; chunks of all sequences are
numbered in order (chunk_offsets[n] = number of chunks before sequence n). Grids that run one block
per chunk launch the upper bound ``max_chunks(T, N, C) = ceil(T / C) + N`` blocks; the table marks
blocks beyond the real count with start == end == 0 and they exit at once.

``chunk_table`` remembers the table of each (sequence bounds, T, C, device) it built (LRU, 64
entries): every layer of a model step, and the backward of the same step, then launch no table
kernels (~8 small ones otherwise). The bounds come from the validated host values of the call, so a
changed cu_seqlens is a different key. Entries looked up during a CUDA-graph capture are pinned
(never evicted), since the captured kernels keep reading their tensors.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace

import torch

_TABLES: OrderedDict = OrderedDict()
_PINNED: set = set()
MAX_TABLES = 64


def f32_buffers(dtype) -> torch.dtype:
    """Dtype of the orchestrations' fp32 buffers (states, per-chunk intermediates) for inputs of
    ``dtype``: float32, or float64 when the float64 kernel twins run (emulate_fwd / emulate_bwd)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def dense_cu_seqlens(B: int, T: int, device) -> torch.Tensor:
    """cu_seqlens of B dense sequences of T tokens in the flattened token axis: [0, T, ..., B*T]."""
    return torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=device)


def max_chunks(T: int, N: int, C: int) -> int:
    """Upper bound on sum_n ceil(L_n / C) for N sequences packed into T tokens."""
    return -(-T // C) + N


@dataclass(frozen=True)
class ChunkTable:
    """Device tensors describing the chunks of a packed batch.

    Attributes:
        cu_seqlens: `[N + 1]` int32 sequence boundaries.
        chunk_offsets: `[N + 1]` int32, index of each sequence's first chunk (last entry = total).
        chunk_bounds: `[NCmax, 2]` int32 (start token, end token) of every chunk; unused rows 0, 0.
        n_chunks_max: the launch bound NCmax.
        seq_order: `[N]` int32, the sequences longest first (ties in order): the chunk recurrences of the
            forward and the backward dispatch their blocks in this order (common/bwd_h.sequence_block, the
            forward kernels' grid rows), so the longest chains start first.
        tokens_end: host value of cu_seqlens[-1] (where the padding tail starts), or None when the
            table was built from device values only.
        lanes: the tables of its runs of sequences that `lane_table` built (cached with the table).
    """

    cu_seqlens: torch.Tensor
    chunk_offsets: torch.Tensor
    chunk_bounds: torch.Tensor
    n_chunks_max: int
    seq_order: torch.Tensor
    tokens_end: int | None = None
    lanes: dict = field(default_factory=dict, compare=False, repr=False)


def build_chunk_table(cu_seqlens: torch.Tensor, T: int, C: int) -> ChunkTable:
    """Chunk table for sequences packed into the flattened token axis of length T."""
    cu = cu_seqlens.to(torch.int64)
    N = cu.numel() - 1
    lens = cu[1:] - cu[:-1]
    n_chunks = (lens + C - 1) // C
    offsets = torch.zeros(N + 1, dtype=torch.int64, device=cu.device)
    offsets[1:] = torch.cumsum(n_chunks, 0)
    ncmax = max_chunks(T, N, C)
    idx = torch.arange(ncmax, device=cu.device)
    seq = torch.searchsorted(offsets[1:], idx, right=True).clamp_(max=max(N - 1, 0))
    start = cu[seq] + C * (idx - offsets[seq])
    end = torch.minimum(start + C, cu[seq + 1])
    valid = idx < offsets[-1]
    start = torch.where(valid, start, 0)
    end = torch.where(valid, end, 0)
    bounds = torch.stack([start, end], 1).to(torch.int32).contiguous()
    order = torch.argsort(n_chunks, descending=True, stable=True).to(torch.int32).contiguous()
    return ChunkTable(cu.to(torch.int32).contiguous(), offsets.to(torch.int32).contiguous(), bounds, ncmax, order)


@dataclass(frozen=True)
class LaneTable:
    """The chunk recurrences' view of sequences a .. b - 1 of a `ChunkTable` (a lane of the backward):
    cu_seqlens and chunk_offsets rows a .. b (absolute token and chunk numbers, so the kernels write into
    the whole problem's buffers), seq_order of the lane's own sequences longest first (local numbers:
    row n of the lane is sequence a + n, so per-sequence tensors are passed as rows a .. b - 1), and the
    lane's chunk rows c0 .. c1 - 1 of chunk_bounds (host numbers)."""

    a: int
    b: int
    c0: int
    c1: int
    cu_seqlens: torch.Tensor
    chunk_offsets: torch.Tensor
    seq_order: torch.Tensor


def lane_table(table: ChunkTable, a: int, b: int, chunks) -> LaneTable:
    """`LaneTable` of sequences a .. b - 1 (``chunks``: every sequence's chunk count, host values), built on the
    device from the table's tensors (no host sync) once per table and lane. One first built inside a CUDA-graph
    capture is not kept: its tensors get their values only when the graph replays, so an eager call reading them
    before that would read garbage (the capture's own ops form them on every replay)."""
    key = (a, b)
    if key in table.lanes:
        return table.lanes[key]
    n = table.chunk_offsets[a + 1:b + 1] - table.chunk_offsets[a:b]
    order = torch.argsort(n, descending=True, stable=True).to(torch.int32).contiguous()
    c0 = sum(chunks[:a])
    lane = LaneTable(a, b, c0, c0 + sum(chunks[a:b]), table.cu_seqlens[a:b + 1].clone(),
                     table.chunk_offsets[a:b + 1].clone(), order)
    device = table.cu_seqlens.device
    if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        table.lanes[key] = lane
    return lane


def chunk_table(cu_seqlens: torch.Tensor | None, seq_bounds, B: int, T: int, C: int, device) -> ChunkTable:
    """The chunk table of one call: B dense sequences of T tokens (``cu_seqlens`` None) or the packed
    sequences of ``cu_seqlens``; ``seq_bounds`` are their host (bos, eos) pairs (validate.Problem), or
    None (a capture of an unseen cu_seqlens: built on the device, not cached)."""
    device = torch.device(device)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    key = None if seq_bounds is None else (tuple(seq_bounds), B * T, C, str(device))
    if key is not None and key in _TABLES:
        _TABLES.move_to_end(key)
        if capturing:
            _PINNED.add(key)
        return _TABLES[key]
    cu = dense_cu_seqlens(B, T, device) if cu_seqlens is None else cu_seqlens.to(device, torch.int32)
    table = build_chunk_table(cu, B * T, C)
    if seq_bounds is not None:
        table = replace(table, tokens_end=max((e for _, e in seq_bounds), default=0))
    if key is not None:
        _TABLES[key] = table
        if capturing:
            _PINNED.add(key)
        for old in [k for k in _TABLES if k not in _PINNED][: max(len(_TABLES) - MAX_TABLES, 0)]:
            del _TABLES[old]
    return table
