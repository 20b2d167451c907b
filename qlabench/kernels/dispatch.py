"""Compute capability -> architecture module, chunk size and explicit TileLang target.

Targets are always explicit dicts (never "auto"): TileLang's kernel cache key contains the target's
text, and an explicit target lets every kernel compile on a machine without a GPU (`qlabench aot`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    name: str  # "sm90", "sm100", "sm120"
    module: str  # qlabench.kernels.<module>
    chunk_size: int
    target: dict
    capabilities: tuple[tuple[int, int], ...]
    has_backward: bool

    @property
    def target_key(self) -> str:
        return f"{self.target['kind']}:{self.target['arch']}"


ARCHS: dict[str, Arch] = {
    "sm90": Arch("sm90", "hopper", 64, {"kind": "cuda", "arch": "sm_90a"}, ((9, 0),), True),
    "sm100": Arch("sm100", "blackwell", 64, {"kind": "cuda", "arch": "sm_100a"}, ((10, 0), (10, 3)), True),
    "sm120": Arch("sm120", "blackwell_sm120", 32, {"kind": "cuda", "arch": "sm_120a"},
                  ((12, 0), (12, 1)), False),
}


def arch_by_name(name: str) -> Arch:
    """`sm90` / `sm100` / `sm120` (also `sm103`, `sm121`) -> Arch; a clear ValueError otherwise."""
    aliases = {"sm103": "sm100", "sm121": "sm120", "sm90a": "sm90", "sm100a": "sm100", "sm120a": "sm120"}
    key = aliases.get(name, name)
    if key not in ARCHS:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(sorted(ARCHS))}")
    return ARCHS[key]


def arch_for_capability(major: int, minor: int) -> Arch:
    """Compute capability -> Arch; unknown capabilities raise ValueError (at call time)."""
    for arch in ARCHS.values():
        if (major, minor) in arch.capabilities:
            return arch
    raise ValueError(
        f"no qlabench kernels for compute capability {major}.{minor}; supported: "
        + ", ".join(f"{a}.{b} ({arch.name})" for arch in ARCHS.values() for a, b in arch.capabilities)
    )


def arch_for_device(device) -> Arch:
    """The Arch of a CUDA device (torch.device, index or tensor)."""
    import torch

    if isinstance(device, torch.Tensor):
        device = device.device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(
            f"qlabench kernels run on CUDA devices, got a tensor on {device}; for CPU use "
            "qlabench.kernels.reference.chunk_gated_delta_rule_ref"
        )
    major, minor = torch.cuda.get_device_capability(device)
    return arch_for_capability(major, minor)
