"""Shared-memory layout annotations the kernels share."""

import tilelang


def swizzled(*tiles) -> dict:
    """``T.annotate_layout``'s argument putting each shared tile in TileLang's swizzled layout. For tiles
    written from fragments by stmatrix (eight rows at one column, which a plain row-major tile puts in
    one bank) and read back row-wise; tiles that feed a gemm are swizzled by TileLang itself."""
    return {tile: tilelang.layout.make_swizzled_layout(tile) for tile in tiles}
