"""Correctness against the float64 reference: relative L2 error per tensor.

    err(x) = ||x - x_ref||_2 / ||x_ref||_2        (float64; ||x - x_ref||_2 when x_ref is all zero)

A row is ``incorrect`` when any checked tensor's error exceeds the tolerance (0.02 by default, FlashQLA's
unit-test bound) or the tensor holds NaN/Inf (its error is then recorded as NaN/Inf, stored as null).
Forward checks ``o`` and ``final_state``; bwd/fwdbwd check dq, dk, dv, dg, dbeta and dh0.
``Verdict.nonfinite`` counts the NaN/Inf elements of each tensor that has any (rows: ``nonfinite``), so
a null error reads as "3 bad elements" or "all of them"; a missing or misshapen output is not counted
there (its error is infinite, stored as null too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

DEFAULT_TOLERANCE = 0.02


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64; inf on a shape mismatch, nan when x holds NaN/Inf."""
    if x is None or ref is None:
        raise ValueError("rel_l2 needs two tensors, got None")
    if tuple(x.shape) != tuple(ref.shape):
        return math.inf
    xd = x.detach().to(device=ref.device, dtype=torch.float64)
    if not bool(torch.isfinite(xd).all()):
        return math.nan
    r = ref.detach().to(torch.float64)
    num = torch.linalg.vector_norm(xd - r).item()
    den = torch.linalg.vector_norm(r).item()
    return num / den if den > 0 else num


def nonfinite_count(x: torch.Tensor) -> int:
    """Number of NaN/Inf elements of ``x``."""
    return int((~torch.isfinite(x.detach())).sum().item()) if x.is_floating_point() else 0


@dataclass
class Verdict:
    errors: dict[str, float] = field(default_factory=dict)
    tolerance: float = DEFAULT_TOLERANCE
    nonfinite: dict[str, int] = field(default_factory=dict)  # tensor -> NaN/Inf elements, only where > 0

    @property
    def bad(self) -> list[str]:
        return [k for k, e in self.errors.items() if not (math.isfinite(e) and e <= self.tolerance)]

    @property
    def ok(self) -> bool:
        return not self.bad

    def message(self) -> str:
        if self.ok:
            return ""
        parts = []
        for k in self.bad:
            e = self.errors[k]
            if k in self.nonfinite:
                parts.append(f"{k}: non-finite ({self.nonfinite[k]} NaN/Inf elements)")
            else:
                parts.append(f"{k}: {'non-finite (NaN/Inf)' if math.isnan(e) else f'{e:.3g}'}")
        return f"rel L2 over {self.tolerance:g}: " + ", ".join(parts)


def compare(outputs: dict[str, torch.Tensor | None], reference: dict[str, torch.Tensor | None],
            tolerance: float = DEFAULT_TOLERANCE) -> Verdict:
    """Per-tensor errors for every name the reference holds; a missing output counts as infinite."""
    if not (isinstance(tolerance, (int, float)) and tolerance > 0):
        raise ValueError(f"tolerance must be a positive number, got {tolerance!r}")
    errors, nonfinite = {}, {}
    for name, ref in reference.items():
        if ref is None:
            continue
        out = outputs.get(name)
        errors[name] = math.inf if out is None else rel_l2(out, ref)
        if math.isnan(errors[name]):  # rel_l2: NaN exactly when a same-shaped output holds NaN/Inf
            nonfinite[name] = nonfinite_count(out)
    return Verdict(errors, float(tolerance), nonfinite)
