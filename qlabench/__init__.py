"""qlabench: Gated DeltaNet kernels (TileLang) and a suite that measures and tracks them."""

__version__ = "0.1.0"
