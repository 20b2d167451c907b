"""The backend registry: the ``Backend`` base class and ``@register``. A leaf: it knows no backend.

Adding a backend is one file under ``qlabench/baselines/`` (ours is ``baselines/qla.py``): subclass
``Backend``, decorate it with ``@register("name")``, and import the module from
``qlabench/baselines/__init__.py``. Optional libraries are imported inside ``available()``, which
returns ``(False, reason)`` instead of raising, so a machine without them still lists and runs
everything else. Lookup by name, variants and gradients are ``qlabench/backends.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .workload import Workload


class Backend:
    """Base class. Subclasses set ``name``/``description`` and implement ``forward``."""

    name: str = ""
    description: str = ""
    # kernel names a profiler may see for this backend; used by check_kernels (FLA path check)
    expects_cuda: bool = True
    # the phases it implements; the runner records a row of any other phase as unavailable
    phases: tuple[str, ...] = ("fwd", "bwd", "fwdbwd")

    def available(self, device: str) -> tuple[bool, str]:
        """Whether this backend can run on ``device`` ('cuda' or 'cpu'), and why not."""
        if self.expects_cuda and device != "cuda":
            return False, f"{self.name} runs on CUDA GPUs only (device={device})"
        if self.expects_cuda and not torch.cuda.is_available():
            return False, "no CUDA GPU visible to torch"
        return True, ""

    def supports(self, phase: str) -> tuple[bool, str]:
        """Whether this backend implements ``phase`` ('fwd', 'bwd', 'fwdbwd'), and why not."""
        if phase in self.phases:
            return True, ""
        return False, f"{self.name} implements {', '.join(self.phases)} only, not {phase}"

    def version(self) -> str | None:
        return None

    def forward(self, w: Workload) -> tuple[torch.Tensor, torch.Tensor]:
        """(o `[1, T, h_v, V]`, final_state `[N, h_v, K, V]` fp32) with w.h0 and the final state on."""
        raise NotImplementedError

    def check_kernels(self, phase: str, kernel_names: list[str]) -> tuple[bool, str]:
        """Verifies, from the GPU kernel names one call launched, that the intended path ran."""
        return True, ""

    def with_options(self, spec: str) -> Backend:
        """This backend with the options ``spec`` (the part after ``name:``); ValueError naming the
        bad key or value. Backends without options refuse any."""
        raise ValueError(f"backend {self.name!r} takes no options, got {self.name}:{spec}")

    def options_record(self) -> dict | None:
        """The options every row of this backend records (``options``); None: it has none."""
        return None

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


_REGISTRY: dict[str, type[Backend]] = {}
_BUILTINS_LOADED = False


def register(name: str):
    """Class decorator: registers a Backend subclass under ``name``."""

    def deco(cls: type[Backend]) -> type[Backend]:
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise TypeError(f"@register({name!r}) needs a Backend subclass, got {cls!r}")
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"backend {name!r} is already registered ({_REGISTRY[name].__qualname__})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)
