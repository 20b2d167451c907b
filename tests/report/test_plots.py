"""Plots are written and carry non-trivial content (not blank images)."""

import matplotlib.image as mpimg
import numpy as np

from qlabench.report import build_report
from qlabench.report.plots import write_plots
from qlabench.report.synthetic import demo_results


def _non_blank(path) -> bool:
    img = mpimg.imread(path)[..., :3]
    # a blank figure is (nearly) one colour; a plot has many distinct pixel values and ink
    ink = (img.mean(axis=-1) < 0.9).mean()
    return len(np.unique(img.reshape(-1, 3), axis=0)) > 50 and ink > 0.02


def test_write_plots(tmp_path):
    made = write_plots(build_report(demo_results()), tmp_path)
    assert made["fwd"] == ["speedup_fwd.png", "latency_fwd.png", "heatmap_fwd_vs_fla.png",
                           "heatmap_fwd_vs_flash_qla.png"]
    # bwd: no single-sequence length sweep (one length only) and flash_qla unavailable -> no such plots
    assert made["bwd"] == ["speedup_bwd.png", "heatmap_bwd_vs_fla.png"]
    for files in made.values():
        for f in files:
            p = tmp_path / f
            assert p.stat().st_size > 10_000, f
            assert _non_blank(p), f


def test_speedup_plot_title_and_legend_cover_no_panel():
    """The figure title and the legend sit above every panel: no overlap with a panel's title, and
    the legend is outside every panel (it hid the rightmost bars)."""
    import matplotlib.pyplot as plt

    from qlabench.report.plots import speedup_figure

    report = build_report(demo_results())
    table = next(t for t in report.tables if t.phase == "fwd")
    fig = speedup_figure(report, table)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    sup = fig._suptitle.get_window_extent(r)
    (legend,) = fig.legends
    leg = legend.get_window_extent(r)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        assert not sup.overlaps(ax.title.get_window_extent(r)) and not leg.overlaps(ax.get_window_extent(r))
        assert not leg.overlaps(ax.title.get_window_extent(r)) and ax.get_legend() is None
    assert not sup.overlaps(leg)
    plt.close(fig)


def test_latency_plot_title_covers_no_panel_title():
    import matplotlib.pyplot as plt

    from qlabench.report.plots import latency_figure

    report = build_report(demo_results())
    fig = latency_figure(report, next(t for t in report.tables if t.phase == "fwd"))
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    sup = fig._suptitle.get_window_extent(r)
    assert not any(sup.overlaps(ax.title.get_window_extent(r)) for ax in fig.axes if ax.get_visible())
    plt.close(fig)
