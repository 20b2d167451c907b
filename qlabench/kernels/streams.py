"""Independent launch sequences side by side: the backward's h recompute beside its dh pass (`Beside`), and the
backward's lanes of sequences (`Lanes`).

bwd_h (the states h, forward over chunks) and the dh pass (bwd_dh, and with CP its local pass, chain and
final pass) read none of each other's outputs: only the per-chunk gradients after them need both. Run
one after the other, each leaves SMs idle while its longest chains finish (sequences of unequal length,
or a last partial wave); run side by side, the blocks of one fill the SMs the other leaves.

`Beside` queues the dh pass on a second stream of high priority (the block scheduler serves its pending
blocks first, so the longer path is not held up behind the h recompute's blocks) that starts after
everything queued so far on the caller's stream; the caller's stream runs bwd_h and then, on leaving the
`with` block, waits for the second stream before anything reads dh. Tensors the second stream uses are allocated on the
caller's stream before the fork and freed only after the join, so the caching allocator never hands
their memory to a launch that could overlap them. Works under CUDA-graph capture (the second stream
forks from and joins the capturing stream). Off CUDA (the float64 twins) the work runs inline.
"""

from __future__ import annotations

import contextlib
import functools

import torch

__all__ = ["Beside", "Lanes"]


@functools.cache
def _side_stream(device_index: int, slot: int = 0, high: bool = True) -> torch.cuda.Stream:
    """Stream ``slot`` of the high- or the default-priority pool of a device, reused by every call (creating
    streams per call leaks them into CUDA graphs' node lists and costs a driver call)."""
    least, highest = torch.cuda.Stream.priority_range()  # (least, greatest): lower numbers are served first
    return torch.cuda.Stream(device=device_index, priority=highest if high else least)


class Beside:
    """A fork of the caller's current stream on ``device`` (see the module docstring).

    with Beside(dev) as beside:
        with beside.side():   # queued on the second stream, after everything queued so far
            ...                # the dh pass
        ...                    # the h recompute, on the caller's stream
    # leaving the block: the caller's stream waits for the second one
    """

    def __init__(self, device: torch.device):
        self.main = self.stream = None  # off CUDA: inline
        if device.type == "cuda":
            self.main = torch.cuda.current_stream(device)
            self.stream = _side_stream(device.index if device.index is not None else torch.cuda.current_device())

    def __enter__(self) -> Beside:  # noqa: PYI034
        if self.stream is not None:
            self.stream.wait_stream(self.main)
        return self

    @contextlib.contextmanager
    def side(self):
        """Launches inside run on the second stream (inline off CUDA)."""
        if self.stream is None:
            yield
            return
        with torch.cuda.stream(self.stream):
            yield

    def __exit__(self, *exc) -> None:
        if self.stream is not None:
            self.main.wait_stream(self.stream)


class Lanes:
    """Launch sequences on streams of their own, forked from the caller's current stream on ``device``: ``high[i]``
    says whether stream i is served first (the block scheduler dispatches the pending blocks of high-priority
    streams before the others'). Entering forks every stream after everything queued so far on the caller's
    stream; `wait` orders one stream after another's work queued so far; leaving joins them all back into the
    caller's stream. The same allocation rule as `Beside` holds: tensors used on a lane are allocated on the
    caller's stream before the fork and freed after the join. Off CUDA every lane runs inline.

    with Lanes(dev, (True, True, False, False)) as lanes:
        with lanes.on(0): ...      # queued on stream 0
        lanes.wait(1, 0)           # stream 1 runs on after what stream 0 has queued so far
    """

    def __init__(self, device: torch.device, high: tuple[bool, ...]):
        self.main, self.streams = None, [None] * len(high)
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.main = torch.cuda.current_stream(device)
            slots = {True: 0, False: 0}
            self.streams = []
            for h in high:
                self.streams.append(_side_stream(index, slots[h], h))
                slots[h] += 1

    def __enter__(self) -> Lanes:  # noqa: PYI034
        if self.main is not None:
            for s in self.streams:
                s.wait_stream(self.main)
        return self

    @contextlib.contextmanager
    def on(self, i: int):
        """Launches inside run on stream i (inline off CUDA)."""
        if self.main is None:
            yield
            return
        with torch.cuda.stream(self.streams[i]):
            yield

    def wait(self, i: int, j: int) -> None:
        """Stream i's later work waits for what stream j has queued so far."""
        if self.main is not None:
            self.streams[i].wait_stream(self.streams[j])

    def __exit__(self, *exc) -> None:
        if self.main is not None:
            for s in self.streams:
                self.main.wait_stream(s)
