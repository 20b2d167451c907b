"""Names and cells every report renderer shares (a leaf: it imports no other report module).

The speed tables (tables.py), the first-call section (firstcall.py) and the accuracy section
(accuracy.py) each render text, markdown and HTML; what they must spell alike lives here.
"""

from __future__ import annotations

import math

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


def html_cells(tag: str, cells: list[str], n_left: int) -> list[str]:
    """One html table row's cells (``th`` or ``td``, escaped), the first ``n_left`` left-aligned."""
    import html

    return [f"<{tag} class='{'l' if i < n_left else ''}'>{html.escape(c)}</{tag}>" for i, c in enumerate(cells)]


def text_table(cols: list[str], body: list[list[str]], left: set[int]) -> list[str]:
    """A plain-text table: the header, a rule under it, the rows; columns ``left`` left-aligned, the rest
    right-aligned, each as wide as its widest cell."""
    widths = [max(len(c) for c in col) for col in zip(cols, *body)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    head = fmt(cols)
    return [head, "-" * len(head)] + [fmt(c) for c in body]


def md_table(cols: list[str], body: list[list[str]], n_left: int) -> list[str]:
    """A markdown table: header, rule (the first ``n_left`` columns left-aligned), rows."""
    return [md_row(cols), md_rule(len(cols), n_left)] + [md_row(r) for r in body]


def html_table_body(cols: list[str], body: list[list[str]], n_left: int) -> list[str]:
    """An html table's header cells (after the caller's opening ``<tr>``), ``</tr>``, then one line per row."""
    return html_cells("th", cols, n_left) + ["</tr>"] + ["<tr>" + "".join(html_cells("td", r, n_left)) + "</tr>"
                                                         for r in body]


def ran_pattern(pattern: str, seqlens, pad_tokens=None) -> str:
    """A row's pattern as it ran: its name when the row's seqlens are the pattern's, else the lengths
    run with the name in parentheses (`1x512 (of 1x32768)`: `run --quick` on the CPU shrinks every
    pattern to at most 512 tokens and keeps the name as the row's identity)."""
    if not isinstance(seqlens, (list, tuple)) or not seqlens:
        return pattern
    from qlabench.workload import parse_pattern  # lazy: the renderers need it only for this

    try:
        nominal = parse_pattern(pattern)
    except (ValueError, TypeError):
        return pattern
    lens = tuple(int(s) for s in seqlens)
    pad = int(pad_tokens) if isinstance(pad_tokens, (int, float)) and not math.isnan(pad_tokens) else 0
    if nominal.seqlens == lens and nominal.pad == pad:
        return pattern
    if len(set(lens)) == 1:
        ran = f"{lens[0]}x{len(lens)}" if len(lens) > 1 else f"1x{lens[0]}"
    else:
        ran = "+".join(str(s) for s in lens)
    return f"{ran}{f'+pad{pad}' if pad else ''} (of {pattern})"
