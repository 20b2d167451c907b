"""Names and cells every report renderer shares (a leaf: it imports no other report module).

The speed tables (tables.py), the first-call section (firstcall.py) and the accuracy section
(accuracy.py) each render text, markdown and HTML; what they must spell alike lives here.
"""

from __future__ import annotations

PHASE_ORDER = ("fwd", "bwd", "fwdbwd")
PHASE_TITLE = {"fwd": "FORWARD", "bwd": "BACKWARD", "fwdbwd": "FORWARD+BACKWARD"}
MISSING = "-"


def phase_heading(phase: str) -> str:
    """A phase's markdown / html heading: 'Forward (fwd)', 'Backward (bwd)', 'Forward+backward (fwdbwd)'."""
    return f"{PHASE_TITLE[phase].capitalize()} ({phase})"


def md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def md_rule(n_cols: int, n_left: int) -> str:
    """A markdown header rule: the first ``n_left`` columns left-aligned, the rest right-aligned."""
    return "|" + "|".join("---" if i < n_left else "---:" for i in range(n_cols)) + "|"
