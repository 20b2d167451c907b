"""FlashInfer's GDN prefill (PyPI ``flashinfer-python``), the "FlashInfer" column: forward only.

The API is ``flashinfer.gdn_prefill.chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state,
output_final_state, cu_seqlens, ..., use_cp="auto", backend="auto", max_seqlen=None)`` (0.7.2.post1).
On SM90 it runs ``gdn_kernels/delta_rule_dsl/delta_rule_sm90.py`` (one fused warp-specialised CuTe DSL
kernel), or, when the heuristic finds too few sequences x heads for the SMs, the context-parallel
``delta_rule_cp_sm90.py`` kernels. Both are CuTe DSL (nvidia-cutlass-dsl), compiled in-process at
the first call of each specialisation (no nvcc, no prebuilt cubin; ~4 s for the SM90 kernel on a CPU
here), which ``first_call_s`` shows. FlashInfer has no backward for it: ``phases = ("fwd",)``, the
runner records bwd and fwdbwd rows as unavailable.

Conversions from a ``Workload``, outside the timed region: the copies (``to_flashinfer``: alpha, the
transposed initial state, a zeroed output for a padding tail) are made at the first call of a workload
and cached until it is freed; the timed call is FlashInfer's function plus views (no GPU work) of the
inputs and of its outputs:

=============== ====================================== ==========================================
input           qlabench                               FlashInfer
=============== ====================================== ==========================================
q, k            ``[1, T, h_qk, K]`` bf16               ``[T, h_qk, K]`` (a view)
v               ``[1, T, h_v, V]`` bf16                ``[T, h_v, V]`` (a view)
gate            ``g`` natural-log gate, fp32, <= 0     ``alpha = exp(g)`` fp32 ``[T, h_v]`` (the kernel
                                                       takes log2(alpha + 1e-10) itself, so a gate
                                                       below about -23 per token acts as -23: a decay
                                                       of e^-23 instead of less, invisible in fp32)
beta            ``[1, T, h_v]`` fp32                   ``[T, h_v]`` (a view)
initial state   ``[N, h_v, K, V]`` fp32                ``[N, h_v, V, K]`` (transposed copy)
final state     ``[N, h_v, K, V]``                     returned ``[N, h_v, V, K]``: a transposed view
output          ``[1, T, h_v, V]``                     ``[T, h_v, V]``: ``o[None]`` (a view)
=============== ====================================== ==========================================

GVA heads: FlashInfer maps state/v-head h to q/k head ``h * h_qk // h_v`` = ``h // (h_v / h_qk)``, the
reference's rule. ``scale`` is passed as is. ``max_seqlen`` (a host int, the longest sequence) is passed
as FlashInfer's docs advise for its CP path. A padding tail (``cu_seqlens[-1] < T``): FlashInfer writes
only the tokens of sequences into an output it allocates with ``torch.empty``, so for such a workload
a zeroed output buffer is made once and passed as ``output=`` (the tail's o must be 0).

``check_kernels`` verifies, from the profiler's kernel names, that a FlashInfer GDN kernel ran (CuTe
DSL names carry their Python module path: ``kernel_cutlass_kernel_flashinfergdn_kernelsdelta_rule_dsl
delta_rule_sm90_FullyFusedDeltaRuleSm90_...``) and that no FLA/FlashQLA/TileLang kernel did.
``import flashinfer`` needs nvidia-cutlass-dsl, cuda-bindings and apache-tvm-ffi: it happens inside
``available()``, whose reason carries the import error. Getting it onto the GPU machine:
``tools/flashinfer_bundle.README.md``.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import weakref
from dataclasses import dataclass
from typing import ClassVar

import torch

from qlabench.envinfo import library_versions
from qlabench.registry import Backend, register

MODULE = "flashinfer.gdn_prefill"
FUNCTION = "chunk_gated_delta_rule"
# compute-capability major -> (the gdn_prefill attribute that is None when that kernel failed to
# import, the module that defines it: imported again for the exact reason)
ARCH_KERNELS = {
    9: ("chunk_gated_delta_rule_sm90", "flashinfer.gdn_kernels.delta_rule_dsl.delta_rule_sm90"),
    10: ("chunk_gated_delta_rule_sm100", "flashinfer.gdn_kernels.blackwell"),
    12: ("chunk_gated_delta_rule_sm120", "flashinfer.gdn_kernels.delta_rule_dsl.delta_rule_sm120"),
}
NO_BACKWARD = ("FlashInfer has no backward for chunk_gated_delta_rule (its GDN API is a forward-only "
               "prefill kernel)")

# a kernel of FlashInfer's: its name carries "flashinfer" (CuTe DSL: the module path; CUDA: the
# namespace); one of its GDN kernels also carries one of these
FLASHINFER_MARK = "flashinfer"
GDN_MARKS = ("gdn", "deltarule", "delta_rule")
# substrings (lower case) of kernels of the other columns: FLA's Triton, FlashQLA/TileLang, ours
FOREIGN_KERNELS = ("chunk_gated_delta_rule_fwd", "chunk_fwd_kernel_o", "recompute_w_u_fwd",
                   "chunk_scaled_dot_kkt", "chunk_local_cumsum", "solve_tril", "tilelang", "flash_qla",
                   "flashqla", "fused_gdr", "kkt_solve")


def classify_kernels(phase: str, kernel_names) -> tuple[bool, str]:
    """(True, '') when a FlashInfer GDN kernel ran and no other column's kernel did; (False, why)
    otherwise. Other kernels (torch's fills and copies) pass. Pure: testable on CPU."""
    names = sorted({str(n) for n in kernel_names})
    ours = [n for n in names if FLASHINFER_MARK in n.lower()]
    foreign = [n for n in names if n not in ours and any(s in n.lower() for s in FOREIGN_KERNELS)]
    if foreign:
        return False, f"non-FlashInfer GDN kernels ran: {', '.join(foreign[:5])}"
    if not any(m in n.lower() for n in ours for m in GDN_MARKS):
        shown = ", ".join(n[:120] for n in names[:8]) or "(no kernels recorded)"
        return False, f"no FlashInfer GDN kernel seen for {phase} (saw: {shown})"
    return True, ""


@dataclass
class FlashInferInputs:
    """The copies a workload needs in FlashInfer's convention (module docstring), made once.

    ``alpha`` = exp(g) ``[T, h_v]``; ``h0`` the initial state as ``[N, h_v, V, K]`` (None without one);
    ``output`` a zeroed ``[T, h_v, V]`` output for a workload with a padding tail (else None: FlashInfer
    allocates its own); ``max_seqlen`` the longest sequence (FlashInfer's CP hint). ``source``: weak
    references to the tensors they were made from, with their versions.
    """

    alpha: torch.Tensor
    h0: torch.Tensor | None
    output: torch.Tensor | None
    max_seqlen: int
    source: tuple = ()

    def made_from(self, w) -> bool:
        """Whether these were made from ``w``'s very tensors, unmodified since."""
        return all((ref is None and t is None) or (ref is not None and t is not None and ref[0]() is t
                                                    and ref[1] == t._version)
                   for ref, t in zip(self.source, _sources(w), strict=True))


def _sources(w) -> tuple:
    """The workload tensors the copies are made from (the views are made per call)."""
    return (w.g, w.h0, w.cu_seqlens, w.v)


def flat(x: torch.Tensor) -> torch.Tensor:
    """``[1, T, ...]`` -> ``[T, ...]``: a view of a contiguous input (no GPU work), else a copy."""
    if x.shape[0] != 1:
        raise ValueError(f"FlashInfer's GDN prefill takes packed varlen inputs (B = 1), got {tuple(x.shape)}")
    return x[0].contiguous()


def to_flashinfer(w, on_release=None) -> FlashInferInputs:
    """The copies ``w`` needs in FlashInfer's layout and gate convention. Pure torch. ``on_release``:
    called once ``w.g`` is freed (the workload is gone), so a cache of these can let go of them."""
    T = w.q.shape[1]
    bounds = [int(x) for x in w.cu_seqlens.tolist()]
    n = len(bounds) - 1
    lens = [b - a for a, b in itertools.pairwise(bounds)]
    # FlashInfer refuses a bound below ceil(T / N) (T counts the padding tail) or above T
    max_seqlen = min(T, max(max(lens, default=1), -(-T // max(n, 1))))
    output = None
    if bounds[-1] < T:  # a padding tail: FlashInfer leaves it unwritten in its torch.empty output
        output = torch.zeros(T, w.v.shape[2], w.v.shape[3], dtype=w.v.dtype, device=w.v.device)
    h0 = None if w.h0 is None else w.h0.transpose(-1, -2).contiguous()
    source = tuple(None if t is None else (weakref.ref(t, on_release) if on_release and t is w.g
                                           else weakref.ref(t), t._version)
                   for t in _sources(w))
    return FlashInferInputs(alpha=torch.exp(flat(w.g).float()).contiguous(), h0=h0, output=output,
                            max_seqlen=max_seqlen, source=source)


def from_flashinfer(o: torch.Tensor, final_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's (o ``[T, h_v, V]``, final ``[N, h_v, V, K]``) -> qlabench's (``[1, T, h_v, V]``,
    ``[N, h_v, K, V]``): two views, no copy."""
    return o.unsqueeze(0), final_state.transpose(-1, -2)


def _import_error(module: str) -> str:
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - the reason is the point
        return f"{type(e).__name__}: {e}"
    return "it imports now, but flashinfer.gdn_prefill saw it fail"


@register("flashinfer")
class FlashInferBackend(Backend):
    description = "FlashInfer chunk_gated_delta_rule (CuTe DSL GDN prefill, auto CP), forward only"
    phases = ("fwd",)

    _fn = None
    _extra: ClassVar[dict] = {}
    _takes_max_seqlen = False

    def __init__(self):
        self._prep: FlashInferInputs | None = None

    def supports(self, phase: str) -> tuple[bool, str]:
        if phase in self.phases:
            return True, ""
        return False, f"{NO_BACKWARD}; no {phase} rows"

    def available(self, device: str) -> tuple[bool, str]:
        ok, why = super().available(device)
        if not ok:
            return ok, why
        try:
            gp = importlib.import_module(MODULE)
        except Exception as e:  # noqa: BLE001 - ImportError (missing cutlass DSL, cuda-bindings...) or any other
            return False, f"import {MODULE} failed: {type(e).__name__}: {e}"
        fn = getattr(gp, FUNCTION, None)
        if fn is None:
            return False, f"{MODULE} has no {FUNCTION}"
        major, minor = torch.cuda.get_device_capability()
        if major not in ARCH_KERNELS:
            return False, (f"FlashInfer's GDN prefill has no kernel for sm_{major}{minor} (it has SM90, "
                           "SM100/SM103 and SM120)")
        attr, module = ARCH_KERNELS[major]
        if getattr(gp, attr, "absent") is None:
            return False, f"FlashInfer's sm_{major}x GDN kernel did not import ({module}: {_import_error(module)})"
        params = set(inspect.signature(fn).parameters)
        # FlashInfer's own SM90/SM100/SM120 kernels ("auto" picks the same; never cuDNN or Cake)
        type(self)._extra = {"backend": "flashinfer"} if "backend" in params else {}
        type(self)._takes_max_seqlen = "max_seqlen" in params
        type(self)._fn = staticmethod(fn)  # a plain attribute would bind self as q
        return True, ""

    def version(self) -> str | None:
        return library_versions().get("flashinfer")

    def prepared(self, w) -> FlashInferInputs:
        """``to_flashinfer(w)``, made once per workload (its first call) and reused by the timed calls;
        let go of when the workload's tensors are freed or another workload comes."""
        if self._prep is None or not self._prep.made_from(w):
            self._prep = None  # free the previous workload's copies first
            self._prep = to_flashinfer(w, on_release=self._release)
        return self._prep

    def _release(self, ref) -> None:
        """The weak reference to a workload's ``g`` died: drop that workload's copies (only its own)."""
        prep = self._prep
        if prep is not None and prep.source and prep.source[0] is not None and prep.source[0][0] is ref:
            self._prep = None

    def forward(self, w):
        if torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in (w.q, w.k, w.v, w.g, w.beta, w.h0)):
            raise NotImplementedError(NO_BACKWARD)
        if self._fn is None:
            ok, why = self.available("cuda")
            if not ok:
                raise RuntimeError(why)
        a = self.prepared(w)
        extra = dict(self._extra)
        if a.output is not None:
            extra["output"] = a.output
        if self._takes_max_seqlen:
            extra["max_seqlen"] = a.max_seqlen
        o, ht = self._fn(flat(w.q), flat(w.k), flat(w.v), a.alpha, flat(w.beta), scale=w.scale,
                         initial_state=a.h0, output_final_state=True, cu_seqlens=w.cu_seqlens, **extra)
        return from_flashinfer(o, ht)

    def check_kernels(self, phase: str, kernel_names) -> tuple[bool, str]:
        return classify_kernels(phase, kernel_names)

