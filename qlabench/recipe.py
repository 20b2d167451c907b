"""A case's input recipe beyond its sequence lengths: the names of the gate and beta profiles, the
defaults, and the recipe in words. No torch here: reports and results files read these too.

The profiles themselves (how g, beta and h0 are drawn) are in qlabench/workload.py.
"""

from __future__ import annotations

import math

GATE_PROFILES = ("bench", "qwen", "qwen_strong_last", "extreme", "logsigmoid")
BETA_PROFILES = ("sigmoid", "near0", "near1")
DEFAULT_GATE_PROFILE = "bench"
DEFAULT_BETA_PROFILE = "sigmoid"
DEFAULT_H0_SCALE = 1.0


def check_beta_profile(profile: str) -> str:
    if profile not in BETA_PROFILES:
        raise ValueError(f"unknown beta profile {profile!r}; known: {', '.join(BETA_PROFILES)}")
    return profile


def check_h0_scale(scale) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (0 < scale < math.inf):
        raise ValueError(f"h0_scale must be a positive finite number, got {scale!r}")
    return float(scale)


def inputs_label(gate_profile: str, beta_profile: str | None = None, h0_scale: float | None = None) -> str:
    """A case's input recipe in words: the gate profile, then whatever differs from the default
    (``qwen``, ``extreme beta=near1``, ``bench h0x100``)."""
    parts = [str(gate_profile)]
    if beta_profile not in (None, DEFAULT_BETA_PROFILE):
        parts.append(f"beta={beta_profile}")
    if h0_scale is not None and float(h0_scale) != DEFAULT_H0_SCALE:
        parts.append(f"h0x{float(h0_scale):g}")
    return " ".join(parts)
