"""Backend protocol and registry: one small class per implementation of `chunk_gated_delta_rule`.

Adding a backend is one file: subclass ``Backend``, decorate it with ``@register("name")`` and import
the module from ``qlabench/baselines/__init__.py``. Optional libraries are imported inside
``available()``, which returns ``(False, reason)`` instead of raising, so a machine without them still
lists and runs everything else.

Variants: a backend may take options, written ``name:key=value+key=value`` (``qla:cp=on+bwd_dh=ws``).
Each such name is a backend of its own (its own column, its own rows); ``Backend.with_options``
validates them and ``options_record`` is what every row of the backend records (``options``).

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


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        import qlabench.baselines  # noqa: F401  (registers torch, fla, flash_qla)


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


# --- ours ------------------------------------------------------------------------------------------


@register("qla")
class QlaBackend(Backend):
    """Our TileLang kernels (``qlabench.kernels.chunk_gated_delta_rule``); bwd through its autograd."""

    description = "qlabench TileLang kernels (ours); variants qla:key=value+... (qlabench list backends)"

    def __init__(self, options=None):
        from qlabench.kernels.options import KernelOptions

        self.options = KernelOptions() if options is None else options
        self.name = self.name_for(self.options)

    @staticmethod
    def name_for(options) -> str:
        """``qla`` for the default kernels, ``qla:cp=on+bwd_dh=ws`` for a variant."""
        label = options.label()
        return f"qla:{label}" if label else "qla"

    def with_options(self, spec: str) -> QlaBackend:
        from qlabench.kernels.options import parse_options

        return QlaBackend(parse_options(spec, base=self.options))

    def options_record(self) -> dict:
        return self.options.as_dict()

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
            cu_seqlens=w.cu_seqlens, options=self.options,
        )
