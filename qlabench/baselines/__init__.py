"""Peer implementations behind the Backend protocol (qlabench/backends.py).

Importing this package registers ``torch`` (float64 reference), ``fla`` (FLA Triton) and
``flash_qla`` (upstream FlashQLA). None of them imports its library at module import time.
"""

from . import fla_triton, flash_qla, torch_ref

__all__ = ["fla_triton", "flash_qla", "torch_ref"]
