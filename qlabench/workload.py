"""Sequence-length patterns, gate profiles and seeded input generation for one benchmark case.

Every workload is packed varlen (B = 1, int32 ``cu_seqlens``), as FlashQLA and FLA benchmark it,
even for a single sequence.

Pattern grammar (whole string, spaces not allowed):
    ``1x32768`` / ``8192x4``   min(a, b) sequences of max(a, b) tokens (FlashQLA writes both orders)
    ``28672+4096``             explicit lengths, in order
    ``32k_4seq``               ``32 * 1024`` tokens cut into 4 sequences at seeded random points
    ``4096``                   one sequence
    ``512*1`` / ``128*63+128*65``  ``N*L`` = exactly N sequences of L tokens (count first: unlike
                               ``x``, the order matters); such terms mix with plain lengths by ``+``
    ``<pattern>+pad<P>``       any of the above, then a padding tail of P tokens after the last
                               sequence (``cu_seqlens[-1] < T``; its outputs must be 0, its gradients 0)

Gate profiles (natural-log gate g, fp32, always <= 0):
    ``bench``       logsigmoid(randn) / 16, with 25% of the v-heads at g = 0 (FlashQLA's benchmark)
    ``qwen``        -A_h * softplus(0.5 randn + 1), A_h ~ U(0, 16) per v-head, the first head at
                    A = 0 and the last at A = 16 (FlashQLA's unit tests: strong decay, up to ~ -20)
    ``qwen_strong_last``  ``qwen``, except that with one v-head that head is the strong one (A = 16), not
                    an undecayed one (the same draws as ``qwen`` for two or more v-heads); the kernel
                    tests' ``qwen`` (tests/kernels/gdn_inputs.py) and the stress sweep's few-head group,
                    where the one strongly decaying head is not diluted among 8-16 others.
    ``extreme``     ``qwen`` with A_h ~ U(0, 30), the last head at A = 30: about -40 per token there
                    (a chunk's cumulative gate reaches -2500: exp(-gam) overflows fp32)
    ``logsigmoid``  logsigmoid(randn) (FLA's benchmarks)

``make_gate`` is the one definition of these profiles: the suite's inputs and the kernel tests' inputs
(tests/kernels/gdn_inputs.py) both draw their gates through it.

Beta profiles (write strength, fp32): ``sigmoid`` = sigmoid(randn) (the default, FlashQLA's recipe),
``near0`` = sigmoid(randn - 8) (about 2e-5 to 7e-3), ``near1`` = sigmoid(randn + 8) (1 - beta about
2e-5 to 7e-3). ``h0_scale`` multiplies the initial state (randn) to make it large. Both reuse the same
random draws as the default, so a variant differs from its default case only in that transform.
"""

from __future__ import annotations

import itertools
import re
import zlib
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from .recipe import (  # noqa: F401 - the recipe's names, re-exported beside the profiles they name
    BETA_PROFILES,
    DEFAULT_BETA_PROFILE,
    DEFAULT_H0_SCALE,
    GATE_PROFILES,
    check_beta_profile,
    check_h0_scale,
    inputs_label,
)

HEAD_DIM = 128
_BETA_SHIFT = {"sigmoid": 0.0, "near0": -8.0, "near1": 8.0}  # beta = sigmoid(randn + shift)
_GATE_A_MAX = {"qwen": 16.0, "extreme": 30.0, "qwen_strong_last": 16.0}  # the largest per-head decay rate A_h
DEFAULT_CUT_SEED = 42
# The largest pattern a run accepts, checked while parsing, before anything is allocated: 16M tokens
# (512x the 32k patterns; q, k, v alone would be ~100 GB at 16 heads) in at most 64k sequences.
MAX_TOTAL_TOKENS = 2**24
MAX_SEQS = 2**16

_PRODUCT = re.compile(r"^(\d+)x(\d+)$")
_SUM = re.compile(r"^\d+(\+\d+)+$")
_CUT = re.compile(r"^(\d+)(k?)_(\d+)seq$")
_SINGLE = re.compile(r"^\d+$")
_COUNTED = re.compile(r"^(\d+\*)?\d+(\+(\d+\*)?\d+)*$")  # "N*L" terms, with at least one "*"
_PAD = re.compile(r"^(.+)\+pad(\d+)$")


@dataclass(frozen=True)
class Pattern:
    """A named sequence-length pattern: ``name`` as written, ``seqlens`` the lengths it stands for,
    ``pad`` the tokens of a padding tail after the last sequence (0: none)."""

    name: str
    seqlens: tuple[int, ...]
    pad: int = 0

    @property
    def total_tokens(self) -> int:
        """Tokens in sequences (the padding tail excluded)."""
        return sum(self.seqlens)

    @property
    def packed_tokens(self) -> int:
        """T of the packed input: the sequences and the padding tail."""
        return self.total_tokens + self.pad

    @property
    def n_seqs(self) -> int:
        return len(self.seqlens)


def _positive(text: str, value: int, what: str) -> int:
    if value < 1:
        raise ValueError(f"seqlen pattern {text!r}: {what} must be >= 1, got {value}")
    return value


def _bounded(text: str, tokens: int, seqs: int) -> None:
    if tokens > MAX_TOTAL_TOKENS or seqs > MAX_SEQS:
        raise ValueError(f"seqlen pattern {text!r}: {tokens} tokens in {seqs} sequences is beyond the bound of "
                         f"{MAX_TOTAL_TOKENS} tokens and {MAX_SEQS} sequences (qlabench.workload.MAX_TOTAL_TOKENS)")


def _mt19937(seed: int):
    """The 32-bit outputs of torch's CPU generator after ``manual_seed(seed)`` (MT19937, init_genrand
    with the low 32 bits of the seed)."""
    mt = [seed & 0xFFFFFFFF]
    for i in range(1, 624):
        mt.append((1812433253 * (mt[-1] ^ (mt[-1] >> 30)) + i) & 0xFFFFFFFF)
    while True:
        for k in range(624):
            y = (mt[k] & 0x80000000) | (mt[(k + 1) % 624] & 0x7FFFFFFF)
            mt[k] = mt[(k + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
        for y in mt:
            y ^= y >> 11
            y ^= (y << 7) & 0x9D2C5680
            y ^= (y << 15) & 0xEFC60000
            yield y ^ (y >> 18)


def random_cut(total: int, n: int, seed: int = DEFAULT_CUT_SEED) -> tuple[int, ...]:
    """``total`` tokens cut into ``n`` non-empty sequences at sorted, seeded random points.

    The cut points are the first n - 1 entries of ``torch.randperm(total - 1)`` (+ 1) under
    ``manual_seed(seed)``, as the suite has always drawn them, but computed in O(n): torch's CPU randperm
    (for lengths below 2^32 / 20) is a Fisher-Yates shuffle whose step i swaps i with i + random() %
    (len - i), so the first n - 1 steps, over a map of the swapped slots, give the same entries without
    the permutation of every token.
    """
    if n > total:
        raise ValueError(f"cannot cut {total} tokens into {n} non-empty sequences")
    _bounded(f"{total}_{n}seq", total, n)
    draws, size, moved = _mt19937(seed), total - 1, {}
    cuts = []
    for i in range(n - 1):
        j = i + next(draws) % (size - i)
        cuts.append(moved.get(j, j) + 1)
        moved[j] = moved.get(i, i)
    bounds = [0, *sorted(cuts), total]
    return tuple(b - a for a, b in itertools.pairwise(bounds))


def parse_pattern(text: str, cut_seed: int = DEFAULT_CUT_SEED) -> Pattern:
    """Parses one pattern (see the module docstring); a ValueError names the text otherwise."""
    if not isinstance(text, str):
        raise TypeError(f"seqlen pattern must be a string, got {type(text).__name__}: {text!r}")
    s = text.strip()
    if m := _PAD.match(s):
        inner = parse_pattern(m.group(1), cut_seed)
        if inner.pad:
            raise ValueError(f"seqlen pattern {text!r}: only one padding tail (+pad<P>) at the end")
        pad = _positive(text, int(m.group(2)), "the padding tail")
        _bounded(text, inner.total_tokens + pad, inner.n_seqs)
        return Pattern(s, inner.seqlens, pad)
    if m := _PRODUCT.match(s):
        a = _positive(text, int(m.group(1)), "each factor")
        b = _positive(text, int(m.group(2)), "each factor")
        _bounded(text, a * b, min(a, b))
        return Pattern(s, (max(a, b),) * min(a, b))
    if _SUM.match(s):
        lens = tuple(_positive(text, int(x), "each length") for x in s.split("+"))
        _bounded(text, sum(lens), len(lens))
        return Pattern(s, lens)
    if m := _CUT.match(s):
        total = _positive(text, int(m.group(1)), "the token total") * (1024 if m.group(2) else 1)
        n = _positive(text, int(m.group(3)), "the sequence count")
        if n > total:
            raise ValueError(f"seqlen pattern {text!r}: {n} sequences do not fit in {total} tokens")
        _bounded(text, total, n)
        return Pattern(s, random_cut(total, n, cut_seed))
    if _SINGLE.match(s):
        length = _positive(text, int(s), "the length")
        _bounded(text, length, 1)
        return Pattern(s, (length,))
    if "*" in s and _COUNTED.match(s):
        terms = []
        for term in s.split("+"):
            count, _, length = term.rpartition("*")
            terms.append((_positive(text, int(count), "each count") if count else 1,
                          _positive(text, int(length), "each length")))
        _bounded(text, sum(n * length for n, length in terms), sum(n for n, _ in terms))
        return Pattern(s, tuple(length for n, length in terms for _ in range(n)))
    raise ValueError(
        f"bad seqlen pattern {text!r}; expected e.g. '1x32768', '8192x4', '28672+4096', '32k_4seq', "
        "'4096', '512*1' or '128*63+128*65+pad1000'"
    )


def scale_pattern(pattern: Pattern, max_tokens: int) -> Pattern:
    """Shrinks a pattern proportionally so it holds at most ``max_tokens`` tokens (--quick on CPU).

    The name stays; every sequence keeps at least one token; a padding tail shrinks by the same
    factor (at least one token).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if pattern.total_tokens <= max_tokens:
        return pattern
    if pattern.pad:
        pad = max(1, pattern.pad * max_tokens // pattern.total_tokens)
        return replace(scale_pattern(replace(pattern, pad=0), max_tokens), pad=pad)
    n = pattern.n_seqs
    if n > max_tokens:
        raise ValueError(f"pattern {pattern.name!r} has {n} sequences, more than {max_tokens} tokens")
    budget = max_tokens - n  # one token per sequence is reserved, the rest is shared out
    extra = [(L - 1) * budget // (pattern.total_tokens - n or 1) for L in pattern.seqlens]
    return replace(pattern, seqlens=tuple(1 + e for e in extra))


# --- gates -----------------------------------------------------------------------------------------


def make_gate(profile: str, T: int, h_v: int, gen: torch.Generator, device, *, batch: int = 1) -> torch.Tensor:
    """Natural-log gate g `[batch, T, h_v]` fp32 for one gate profile (module docstring).

    Every row of a batch shares the per-head choices (the zeroed heads of ``bench``, A_h of ``qwen``);
    with ``batch=1`` (the suite's packed inputs) the draws are the same as they have always been.
    """
    if profile not in GATE_PROFILES:
        raise ValueError(f"unknown gate profile {profile!r}; known: {', '.join(GATE_PROFILES)}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    x = torch.randn(batch, T, h_v, generator=gen, device=device, dtype=torch.float32)
    if profile == "logsigmoid":
        return F.logsigmoid(x)
    if profile == "bench":
        g = F.logsigmoid(x) / 16
        n_zero = round(0.25 * h_v)
        if n_zero:
            heads = torch.randperm(h_v, generator=gen, device=device)[:n_zero]
            g[:, :, heads] = 0.0
        return g
    a_max = _GATE_A_MAX[profile]
    A = torch.rand(h_v, generator=gen, device=device, dtype=torch.float32) * a_max
    A[0] = 0.0
    if h_v > 1 or profile == "qwen_strong_last":
        A[-1] = a_max
    return -A * F.softplus(0.5 * x + 1.0)


# --- inputs ----------------------------------------------------------------------------------------


@dataclass
class Workload:
    """Inputs of one case, on its device.

    Attributes:
        q, k: `[1, T, h_qk, K]` bf16, l2-normalised over K. v: `[1, T, h_v, V]` bf16.
        g: `[1, T, h_v]` fp32 natural-log gate. beta: `[1, T, h_v]` fp32 in (0, 1).
        h0: `[N, h_v, K, V]` fp32 initial state, or None.
        cu_seqlens: `[N + 1]` int32.
        do: `[1, T, h_v, V]` bf16 and dht: `[N, h_v, K, V]` fp32, the backward's incoming gradients.
        scale: K^-1/2.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    h0: torch.Tensor | None
    cu_seqlens: torch.Tensor
    do: torch.Tensor
    dht: torch.Tensor
    scale: float
    seqlens: tuple[int, ...] = field(default=())

    @property
    def device(self) -> torch.device:
        return self.q.device

    def differentiable(self) -> tuple[Workload, tuple[torch.Tensor, ...]]:
        """A copy whose q, k, v, g, beta (and h0) are fresh leaves requiring grad, and those leaves."""
        leaves = {n: getattr(self, n).detach().clone().requires_grad_(True)
                  for n in ("q", "k", "v", "g", "beta")}
        if self.h0 is not None:
            leaves["h0"] = self.h0.detach().clone().requires_grad_(True)
        return replace(self, **leaves), tuple(leaves.values())

    def nbytes(self) -> int:
        ts = (self.q, self.k, self.v, self.g, self.beta, self.h0, self.do, self.dht)
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


def case_seed(seed: int, *parts) -> int:
    """A stable per-case seed: the run seed mixed with the case's identity (not with its order)."""
    return (seed * 1_000_003 + zlib.crc32("/".join(map(str, parts)).encode())) % (2**63)


def make_workload(
    h_qk: int,
    h_v: int,
    seqlens,
    gate_profile: str = "bench",
    seed: int = 0,
    device="cpu",
    head_dim: int = HEAD_DIM,
    with_h0: bool = True,
    dtype: torch.dtype = torch.bfloat16,
    beta_profile: str = DEFAULT_BETA_PROFILE,
    h0_scale: float = DEFAULT_H0_SCALE,
    pad: int = 0,
) -> Workload:
    """Seeded inputs for one case (FlashQLA's benchmark recipe; the class docstring lists shapes).

    ``beta_profile`` / ``h0_scale``: the module docstring's variants. ``pad``: tokens of a padding tail
    after the last sequence (random inputs there too; T = sum(seqlens) + pad).
    """
    for name, x in (("h_qk", h_qk), ("h_v", h_v), ("head_dim", head_dim)):
        if not isinstance(x, int) or x < 1:
            raise ValueError(f"{name} must be a positive int, got {x!r}")
    if h_v % h_qk:
        raise ValueError(f"h_v must be a multiple of h_qk, got h_qk={h_qk}, h_v={h_v}")
    seqlens = tuple(int(s) for s in seqlens)
    if not seqlens or min(seqlens) < 1:
        raise ValueError(f"seqlens must be non-empty positive ints, got {seqlens}")
    check_beta_profile(beta_profile)
    h0_scale = check_h0_scale(h0_scale)
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
        raise ValueError(f"pad must be an int >= 0, got {pad!r}")
    device = torch.device(device)
    T, N, D = sum(seqlens) + pad, len(seqlens), head_dim
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    def unit(x):
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    q = unit(randn(1, T, h_qk, D)).to(dtype)
    k = unit(randn(1, T, h_qk, D)).to(dtype)
    v = randn(1, T, h_v, D).to(dtype)
    g = make_gate(gate_profile, T, h_v, gen, device)
    beta = torch.sigmoid(randn(1, T, h_v) + _BETA_SHIFT[beta_profile])
    h0 = randn(N, h_v, D, D) * h0_scale if with_h0 else None
    do = randn(1, T, h_v, D).to(dtype)
    dht = randn(N, h_v, D, D) / 8
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return Workload(q=q, k=k, v=v, g=g, beta=beta, h0=h0, cu_seqlens=cu, do=do, dht=dht,
                    scale=D**-0.5, seqlens=seqlens)
