"""Pieces shared by every architecture: chunk tables, in-chunk gate cumsum, the TileLang build helper."""
