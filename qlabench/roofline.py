"""Work model of GDN chunked prefill and the per-GPU floor it implies.

Counts (K = V = 128, chunk C = 64; T = total tokens, N = sequences, Hqk / Hv = qk / v heads), from the
FlashQLA design brief, section 7:

    forward   F_impl = 165,888 T Hv                  F_min = T (133,120 Hv + 32,768 Hqk)
              B_min  = T (520 Hv + 512 Hqk) + N Hv 131,072
    backward  F_impl = 491,520 T Hv                  F_min = T (458,752 Hv + 32,768 Hqk)
              B_min  = T (912 Hv + 1,024 Hqk) + N Hv 196,608
    fwdbwd    the sum of the two

F_impl is the tensor-core work as FlashQLA's kernels do it (each v-head recomputes the qk-only
products); F_min shares those across a GQA group. B_min is one pass over bf16 activations with fp32
gate, beta and states. The floor of a case is max(F_impl / peak FLOP/s, B_min / peak bandwidth) -
the time no kernel of this design can beat - and a measured time is reported as a multiple of it.
Tokens are counted as given: padding of a sequence to a whole chunk is not useful work.
"""

from __future__ import annotations

from dataclasses import dataclass

# ---- per-token / per-sequence coefficients (FLOP or bytes) --------------------------------------
_FWD_FLOP_PER_TOKEN_VHEAD = 165_888
_FWD_FLOP_MIN_VHEAD, _FWD_FLOP_MIN_QKHEAD = 133_120, 32_768
_FWD_BYTES_VHEAD, _FWD_BYTES_QKHEAD, _FWD_STATE_BYTES = 520, 512, 131_072

_BWD_FLOP_PER_TOKEN_VHEAD = 491_520
_BWD_FLOP_MIN_VHEAD, _BWD_FLOP_MIN_QKHEAD = 458_752, 32_768
_BWD_BYTES_VHEAD, _BWD_BYTES_QKHEAD, _BWD_STATE_BYTES = 912, 1_024, 196_608

PHASES = ("fwd", "bwd", "fwdbwd")


@dataclass(frozen=True)
class Work:
    """Work of one case in one phase.

    Attributes:
        flop_impl: tensor-core FLOPs as the fused kernels do them.
        flop_min: FLOPs with qk-only products shared across a GQA group.
        bytes_min: minimum HBM traffic in bytes.
    """

    flop_impl: float
    flop_min: float
    bytes_min: float

    def __add__(self, other: Work) -> Work:
        return Work(
            self.flop_impl + other.flop_impl, self.flop_min + other.flop_min, self.bytes_min + other.bytes_min
        )


@dataclass(frozen=True)
class GpuPeak:
    """Peak figures of one GPU model.

    Attributes:
        name: the substring that identifies it in `torch.cuda.get_device_name()`.
        tflops: dense bf16 tensor-core peak in TFLOP/s.
        tbps: HBM bandwidth in TB/s.
        source: where the figures come from.
    """

    name: str
    tflops: float
    tbps: float
    source: str

    @property
    def ridge_flop_per_byte(self) -> float:
        return self.tflops * 1e12 / (self.tbps * 1e12)


# One table, looked up by name substring. Add a GPU only with figures someone measured or checked.
GPU_PEAKS: tuple[GpuPeak, ...] = (
    # achieved (not data-sheet: 989 TFLOP/s, 4.8 TB/s) peaks of H200s of the kind the results ran on
    GpuPeak("H200", 790.0, 4.3, "achieved peaks measured on H200s like the results' ones; data sheet 989, 4.8"),
)


def _check_case(h_qk: int, h_v: int, seqlens) -> tuple[int, int]:
    for name, val in (("h_qk", h_qk), ("h_v", h_v)):
        if not isinstance(val, int) or isinstance(val, bool) or val <= 0:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    if h_v % h_qk:
        raise ValueError(f"h_v must be a multiple of h_qk, got h_qk={h_qk}, h_v={h_v}")
    lens = list(seqlens)
    if not lens or any((not isinstance(n, int)) or isinstance(n, bool) or n <= 0 for n in lens):
        raise ValueError(f"seqlens must be a non-empty list of positive ints, got {seqlens!r}")
    return sum(lens), len(lens)


def work(phase: str, h_qk: int, h_v: int, seqlens) -> Work:
    """FLOPs and minimum bytes of one case.

    Args:
        phase: `fwd`, `bwd` or `fwdbwd`.
        h_qk: qk heads; h_v: v heads (a multiple of h_qk).
        seqlens: lengths of the packed sequences, e.g. `[28672, 4096]`.
    """
    t, n = _check_case(int(h_qk), int(h_v), seqlens)
    if phase == "fwd":
        return Work(
            _FWD_FLOP_PER_TOKEN_VHEAD * t * h_v,
            t * (_FWD_FLOP_MIN_VHEAD * h_v + _FWD_FLOP_MIN_QKHEAD * h_qk),
            t * (_FWD_BYTES_VHEAD * h_v + _FWD_BYTES_QKHEAD * h_qk) + n * h_v * _FWD_STATE_BYTES,
        )
    if phase == "bwd":
        return Work(
            _BWD_FLOP_PER_TOKEN_VHEAD * t * h_v,
            t * (_BWD_FLOP_MIN_VHEAD * h_v + _BWD_FLOP_MIN_QKHEAD * h_qk),
            t * (_BWD_BYTES_VHEAD * h_v + _BWD_BYTES_QKHEAD * h_qk) + n * h_v * _BWD_STATE_BYTES,
        )
    if phase == "fwdbwd":
        return work("fwd", h_qk, h_v, seqlens) + work("bwd", h_qk, h_v, seqlens)
    raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")


def find_gpu(gpu_name: str | None) -> GpuPeak | None:
    """The peak entry whose name occurs in ``gpu_name`` (case-insensitive), or None when unknown."""
    if not gpu_name:
        return None
    low = str(gpu_name).lower()
    for peak in GPU_PEAKS:
        if peak.name.lower() in low:
            return peak
    return None


def unknown_gpu_note(gpu_name: str | None) -> str:
    if not gpu_name:
        return "roofline: the results name no GPU; roofline columns omitted"
    known = ", ".join(p.name for p in GPU_PEAKS)
    return f"roofline: no peak figures for GPU {gpu_name!r} (known: {known}); roofline columns omitted"


@dataclass(frozen=True)
class Floor:
    """Floor of one case on one GPU (seconds) and what bounds it."""

    seconds: float
    compute_s: float
    memory_s: float

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def floor(w: Work, peak: GpuPeak) -> Floor:
    """Lower bound on the time of ``w``: implemented FLOPs at peak or minimum bytes at peak bandwidth."""
    compute = w.flop_impl / (peak.tflops * 1e12)
    memory = w.bytes_min / (peak.tbps * 1e12)
    return Floor(max(compute, memory), compute, memory)


def achieved_tflops(w: Work, ms: float) -> float:
    """Implemented tensor-core FLOPs per second at a measured time, in TFLOP/s."""
    if not ms > 0:
        raise ValueError(f"time must be positive, got {ms!r} ms")
    return w.flop_impl / (ms * 1e-3) / 1e12


def x_of_floor(w: Work, peak: GpuPeak, ms: float) -> float:
    """Measured time as a multiple of the floor (1.0 = at the floor)."""
    if not ms > 0:
        raise ValueError(f"time must be positive, got {ms!r} ms")
    return (ms * 1e-3) / floor(w, peak).seconds
