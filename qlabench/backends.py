"""Backends by name: lookup, variants, and the gradients of a backend's forward.

The registry (the ``Backend`` base class, ``@register``) is ``qlabench/registry.py``, a leaf the backend
modules import; the backends themselves live in ``qlabench/baselines/`` (ours: ``baselines/qla.py``),
which this module imports on first lookup. ``Backend`` and ``register`` are re-exported here.

Variants: a backend may take options, written ``name:key=value+key=value`` (``qla:cp=on+bwd_dh=ws``).
Each such name is a backend of its own (its own column, its own rows); ``Backend.with_options``
validates them and ``options_record`` is what every row of the backend records (``options``).

The runner calls ``forward(w)`` for every phase: under ``torch.no_grad()`` for ``fwd``, and on a
``Workload.differentiable()`` copy followed by ``torch.autograd.grad`` (``gradients`` below) for
``bwd`` / ``fwdbwd``.
"""

from __future__ import annotations

import torch

from .registry import _REGISTRY, Backend, register, unregister
from .workload import Workload

__all__ = ["GRAD_NAMES", "Backend", "backend_names", "canonical_name", "get_backend", "gradients",
           "parse_backends", "register", "unregister"]

GRAD_NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
_BUILTINS_LOADED = False


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        import qlabench.baselines  # noqa: F401  (registers qla, fla, flash_qla, flashinfer, torch)


def backend_names() -> list[str]:
    _load_builtins()
    return list(_REGISTRY)


def get_backend(name: str) -> Backend:
    """The backend ``name``: a registered name, or ``name:key=value+...`` for a variant of it (the
    options exactly as written, over the backend's defaults; no environment is read here)."""
    _load_builtins()
    base, sep, spec = name.partition(":")
    if base not in _REGISTRY:
        raise ValueError(f"unknown backend {base!r}; known: {', '.join(_REGISTRY)}")
    backend = _REGISTRY[base]()
    if sep:
        try:
            backend = backend.with_options(spec)
        except ValueError as e:
            raise ValueError(f"backend {name!r}: {e}") from None
    return backend


def parse_backends(spec) -> list[str]:
    """'qla,fla,qla:cp=on' / ['qla', 'fla'] -> validated canonical names, order kept, duplicates dropped.

    This is the suite's edge for kernel options: a ``qla`` name also takes the QLABENCH_* switches set
    in the environment (read here, once), so ``QLABENCH_CP=on`` with ``qla`` gives ``qla:cp=on`` and the
    rows say which kernels ran. Options written in the name win over the switches.
    """
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [s.strip() for s in items if s.strip()]
    if not names:
        raise ValueError(f"no backend named in {spec!r}")
    return list(dict.fromkeys(canonical_name(n, from_env=True) for n in names))


def canonical_name(name: str, from_env: bool = False) -> str:
    """``qla:bwd_dh=ws+cp=on`` -> ``qla:cp=on+bwd_dh=ws`` (options in field order, defaults dropped,
    ``qla:cp=off`` -> ``qla``); ValueError for an unknown backend or a bad option. ``from_env``: a
    backend with environment switches (qla) starts from them."""
    base, sep, spec = name.partition(":")
    if from_env and base == "qla":
        from qlabench.baselines.qla import QlaBackend
        from qlabench.kernels.options import KernelOptions, parse_options

        env = KernelOptions.from_env()
        try:
            opts = parse_options(spec, base=env) if sep else env
        except ValueError as e:
            raise ValueError(f"backend {name!r}: {e}") from None
        return QlaBackend.name_for(opts)
    return get_backend(name).name


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
