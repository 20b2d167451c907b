"""Compute capability -> architecture, chunk size, explicit TileLang target and kernel modules.

Targets are always explicit dicts (never "auto"): TileLang's kernel cache key contains the target's
text, and an explicit target lets every kernel compile on a machine without a GPU (`qlabench aot`).

`kernel_factory(arch, role)` is the one place that maps an architecture to the file of each kernel
(`KERNEL_MODULES`); forward.py, backward.py and aot.py ask it. An arch-specific file replaces a Hopper
one by changing its row of `KERNEL_MODULES`:
  * sm100 / sm103: every forward and backward kernel with matrix products comes from blackwell/,
    whose products are tcgen05 MMAs into tensor memory (UTCHMMA in the SASS); only the kkt_solve
    inverse's 32-row tf32 products stay mma.sync (tcgen05 tiles start at 64 rows). The Hopper files
    compiled for sm_100a would use mma.sync there (a plain `T.gemm` with a register accumulator).
  * sm90 only: ``chunk_fwd_ws`` and ``chunk_fwd_wy``, the manually warp-specialized recurrences
    (hopper/chunk_fwd_ws.py, hopper/chunk_fwd_wy.py), the forward's default recurrences where an arch has
    them (forward.recurrence_role: ws at V tile 32, wy at 64); the others run chunk_fwd_pipelined, and
    forcing ws or wy there (KernelOptions.fwd_kernel) raises ValueError.
  * sm120 / sm121: blackwell_sm120/ re-exports the Hopper forward files compiled for sm_120a at C = 32
    (mma.sync + TMA: sm120 has neither wgmma nor tcgen05) and checks that each compiled kernel fits
    the 99 KB of shared memory per block; no backward (NotImplementedError).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    name: str  # "sm90", "sm100", "sm120"
    module: str  # qlabench.kernels.<module>: the package for this arch's own kernels (see KERNEL_MODULES)
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


# Kernel role -> "module:factory" under qlabench.kernels, per architecture. Each factory takes the
# arch name as its last positional argument (variant switches follow as keywords: bwd_intra's
# out_dtype) and compiles for that arch's target.
_HOPPER_FORWARD = {
    "kkt_solve": "hopper.kkt_solve:kkt_solve_kernel",
    "chunk_fwd": "hopper.chunk_fwd:chunk_fwd_kernel",
    "chunk_fwd_pipelined": "hopper.chunk_fwd:chunk_fwd_pipelined_kernel",
    # the default recurrence on sm90 (forward.recurrence_role); verified on the H200
    "chunk_fwd_ws": "hopper.chunk_fwd_ws:chunk_fwd_ws_kernel",
    "chunk_fwd_wy": "hopper.chunk_fwd_wy:chunk_fwd_wy_kernel",
    "chunk_fwd_v128": "hopper.chunk_fwd_v128:chunk_fwd_v128_kernel",
}
_HOPPER_BACKWARD = {
    "bwd_prepare": "hopper.bwd_prepare:bwd_prepare_kernel",
    "bwd_h": "hopper.bwd_h_ws:bwd_h_ws_kernel",
    "bwd_dh": "hopper.bwd_dh_pipelined:bwd_dh_pipelined_kernel",
    # every per-chunk gradient in one kernel (bwd_state + bwd_intra fused, intermediates on chip)
    "bwd_chunk": "hopper.bwd_chunk:bwd_chunk_kernel",
}
_SM100_FORWARD = {
    "kkt_solve": "blackwell.kkt_solve:kkt_solve_kernel",
    "chunk_fwd": "blackwell.chunk_fwd:chunk_fwd_kernel",
    "chunk_fwd_pipelined": "blackwell.chunk_fwd:chunk_fwd_pipelined_kernel",
}
_SM120_FORWARD = {
    "kkt_solve": "blackwell_sm120.kkt_solve:kkt_solve_kernel",
    "chunk_fwd": "blackwell_sm120.chunk_fwd:chunk_fwd_kernel",
    "chunk_fwd_pipelined": "blackwell_sm120.chunk_fwd:chunk_fwd_pipelined_kernel",
}
_SM100_BACKWARD = {
    "bwd_prepare": "blackwell.bwd_prepare:bwd_prepare_kernel",
    "bwd_h": "blackwell.bwd_h_pipelined:bwd_h_pipelined_kernel",
    "bwd_dh": "blackwell.bwd_dh_pipelined:bwd_dh_pipelined_kernel",
    "bwd_state": "blackwell.bwd_state:bwd_state_kernel",
    "bwd_intra": "blackwell.bwd_intra:bwd_intra_kernel",
}
FORWARD_ROLES = tuple(_HOPPER_FORWARD)
# the per-chunk gradients are one kernel (bwd_chunk) on sm90 and two (bwd_state, bwd_intra) on sm100
BACKWARD_ROLES = tuple(_HOPPER_BACKWARD) + ("bwd_state", "bwd_intra")
KERNEL_MODULES: dict[str, dict[str, str]] = {
    # verified on an H200; bwd_dh_ws (manually warp-specialized reverse pass) is the default reverse
    # pass (KernelOptions.bwd_dh = auto / ws; backward._dh_role)
    "sm90": {**_HOPPER_FORWARD, **_HOPPER_BACKWARD, "bwd_dh_ws": "hopper.bwd_dh_ws:bwd_dh_ws_kernel",
             "bwd_fused": "hopper.bwd_fused:bwd_fused_kernel"},
    # tcgen05 + tensor memory (blackwell/), forward and backward; compiled only
    "sm100": {**_SM100_FORWARD, **_SM100_BACKWARD},
    "sm120": dict(_SM120_FORWARD),  # Hopper forward for sm_120a, C = 32, smem-checked; compiled only; no backward
}


def kernel_factory(arch: Arch | str, role: str):
    """The factory (``<role>_kernel``-style function) that compiles kernel ``role`` for ``arch``.

    Raises NotImplementedError for a backward kernel of an arch without backward (sm120), ValueError
    for an unknown role.
    """
    a = arch if isinstance(arch, Arch) else arch_by_name(arch)
    table = KERNEL_MODULES[a.name]
    if role not in table:
        if role in BACKWARD_ROLES and not a.has_backward:
            raise NotImplementedError(
                f"qlabench has no backward kernels for {a.name} ({a.module}, compute capability "
                + " / ".join(f"{x}.{y}" for x, y in a.capabilities)
                + "): the forward runs there, gradients do not"
            )
        if role in FORWARD_ROLES + BACKWARD_ROLES:
            raise ValueError(f"kernel {role!r} has no {a.name} version; {a.name} has: {', '.join(table)}")
        raise ValueError(f"unknown kernel {role!r}; known: {', '.join(FORWARD_ROLES + BACKWARD_ROLES)}")
    module, func = table[role].split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), func)


def has_kernel(arch: Arch | str, role: str) -> bool:
    """Whether ``arch`` has a file for kernel ``role`` (the optional ones: chunk_fwd_ws, chunk_fwd_wy,
    bwd_dh_ws are sm90 only)."""
    a = arch if isinstance(arch, Arch) else arch_by_name(arch)
    return role in KERNEL_MODULES[a.name]


def env_choice(var: str, choices: tuple[str, ...], default: str, environ=None) -> str:
    """The value of the environment switch ``var`` (``default`` when unset), read at call time from
    ``environ`` (default os.environ); a value outside ``choices`` raises ValueError naming it. The
    kernels' A/B switches (QLABENCH_CP, QLABENCH_FWD_KERNEL, QLABENCH_BWD_DH, QLABENCH_BWD_CP: the
    fields of options.KernelOptions) all read through here."""
    import os

    value = (os.environ if environ is None else environ).get(var, default)
    if value not in choices:
        raise ValueError(f"{var} must be one of {', '.join(choices)}, got {value!r}")
    return value


def require_backward(arch: Arch) -> None:
    """NotImplementedError naming ``arch`` when it has no backward kernels."""
    if not arch.has_backward:
        kernel_factory(arch, BACKWARD_ROLES[0])


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
