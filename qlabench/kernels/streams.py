"""Two independent launch sequences side by side: the backward's h recompute beside its dh pass.

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

__all__ = ["Beside"]


@functools.cache
def _side_stream(device_index: int) -> torch.cuda.Stream:
    """One high-priority stream per device, reused by every call (creating streams per call leaks
    them into CUDA graphs' node lists and costs a driver call)."""
    _, highest = torch.cuda.Stream.priority_range()  # (least, greatest): lower numbers are served first
    return torch.cuda.Stream(device=device_index, priority=highest)


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
