"""The implementations behind the Backend protocol (qlabench/registry.py), one module each.

Importing this package registers, in this order, ``qla`` (ours, qla.py), ``fla`` (FLA Triton),
``flash_qla`` (upstream FlashQLA), ``flashinfer`` (FlashInfer's GDN prefill, forward only) and ``torch``
(float64 reference). None of them imports its library at module import time.
"""

from . import qla  # noqa: I001 - first: the registry's order is the listing's
from . import fla_triton, flash_qla, flashinfer, torch_ref

__all__ = ["fla_triton", "flash_qla", "flashinfer", "qla", "torch_ref"]
