"""Backend protocol and registry: one small class per implementation of `chunk_gated_delta_rule`.

Adding a backend is one file: subclass ``Backend``, decorate it with ``@register("name")`` and import
the module from ``qlabench/baselines/__init__.py``. Optional libraries are imported inside
``available()``, which returns ``(False, reason)`` instead of raising, so a machine without them still
lists and runs everything else.

The runner calls ``forward(w)`` for every phase: under ``torch.no_grad()`` for ``fwd``, and on a
``Workload.differentiable()`` copy followed by ``torch.autograd.grad`` (``gradients`` below) for
``bwd`` / ``fwdbwd``.
"""

from __future__ import annotations

import torch

from .workload import Workload

GRAD_NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


class Backend:
    """Base class. Subclasses set ``name``/``description`` and implement ``forward``."""

    name: str = ""
    description: str = ""
    # kernel names a profiler may see for this backend; used by check_kernels (FLA path check)
    expects_cuda: bool = True

    def available(self, device: str) -> tuple[bool, str]:
        """Whether this backend can run on ``device`` ('cuda' or 'cpu'), and why not."""
        if self.expects_cuda and device != "cuda":
            return False, f"{self.name} runs on CUDA GPUs only (device={device})"
        if self.expects_cuda and not torch.cuda.is_available():
            return False, "no CUDA GPU visible to torch"
        return True, ""

    def version(self) -> str | None:
        return None

    def forward(self, w: Workload) -> tuple[torch.Tensor, torch.Tensor]:
        """(o `[1, T, h_v, V]`, final_state `[N, h_v, K, V]` fp32) with w.h0 and the final state on."""
        raise NotImplementedError

    def check_kernels(self, phase: str, kernel_names: list[str]) -> tuple[bool, str]:
        """Verifies, from the GPU kernel names one call launched, that the intended path ran."""
        return True, ""

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


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        import qlabench.baselines  # noqa: F401  (registers torch, fla, flash_qla)


def backend_names() -> list[str]:
    _load_builtins()
    return list(_REGISTRY)


def get_backend(name: str) -> Backend:
    _load_builtins()
    if name not in _REGISTRY:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]()


def parse_backends(spec) -> list[str]:
    """'qla,fla' / ['qla', 'fla'] -> validated names, order kept, duplicates dropped."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [s.strip() for s in items if s.strip()]
    if not names:
        raise ValueError(f"no backend named in {spec!r}")
    known = backend_names()
    for n in names:
        if n not in known:
            raise ValueError(f"unknown backend {n!r}; known: {', '.join(known)}")
    return list(dict.fromkeys(names))


def gradients(backend: Backend, w: Workload, outputs=None, leaves=None, retain_graph: bool = False):
    """dq, dk, dv, dg, dbeta (and dh0) of (o, final_state) against (w.do, w.dht), via autograd.

    ``outputs``/``leaves`` come from an earlier ``forward`` on ``w.differentiable()``; when omitted a
    fresh forward runs here (the training step, fwdbwd).
    """
    if outputs is None:
        w, leaves = w.differentiable()
        outputs = backend.forward(w)
    o, ht = outputs
    grads = torch.autograd.grad((o, ht), leaves, (w.do.to(o.dtype), w.dht.to(ht.dtype)),
                                retain_graph=retain_graph, allow_unused=True)
    return dict(zip(GRAD_NAMES, grads))


# --- ours ------------------------------------------------------------------------------------------


@register("qla")
class QlaBackend(Backend):
    """Our TileLang kernels (``qlabench.kernels.chunk_gated_delta_rule``); bwd through its autograd."""

    description = "qlabench TileLang kernels (ours)"

    def available(self, device: str) -> tuple[bool, str]:
        ok, why = super().available(device)
        if not ok:
            return ok, why
        try:
            from qlabench.kernels import kernels_available
        except (ImportError, AttributeError) as e:
            return False, f"kernels not built ({type(e).__name__}: {e})"
        try:
            res = kernels_available(torch.device(device))
        except Exception as e:  # noqa: BLE001 - any failure is a reason to report
            return False, f"kernels_available() failed: {type(e).__name__}: {e}"
        if isinstance(res, tuple):
            return bool(res[0]), str(res[1]) if len(res) > 1 else ""
        return bool(res), "" if res else "kernels_available() returned False"

    def version(self) -> str | None:
        import qlabench

        return qlabench.__version__

    def forward(self, w: Workload):
        from qlabench.kernels import chunk_gated_delta_rule

        return chunk_gated_delta_rule(
            w.q, w.k, w.v, w.g, w.beta, scale=w.scale, initial_state=w.h0, output_final_state=True,
            cu_seqlens=w.cu_seqlens,
        )
