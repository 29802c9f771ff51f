"""Matplotlib figures without pyplot: render to PNG bytes, and show a bare `Figure` as a
cell's value. Shared by the memory chart, timing results, exercises and widgets."""

from __future__ import annotations

__all__ = ["figure_png", "ensure_figure_formatter"]


def figure_png(fig, dpi: float | None = None) -> bytes:
    """Render a matplotlib figure to PNG bytes with Agg, without pyplot.

    Safe from a background thread as long as no other thread draws the same figure.
    """
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    buf = io.BytesIO()
    canvas.print_png(buf) if dpi is None else fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def ensure_figure_formatter() -> None:
    """Let a bare matplotlib `Figure` show as an image when it is a cell's value.

    pyplot's inline backend registers this when pyplot is first used; devlab draws without
    pyplot, so it registers the same PNG formatter when none is there yet.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None:
        return
    from matplotlib.figure import Figure

    png = ip.display_formatter.formatters["image/png"]
    try:
        png.lookup_by_type(Figure)
    except KeyError:
        from functools import partial

        from IPython.core.pylabtools import print_figure

        png.for_type(Figure, partial(print_figure, fmt="png", base64=True))
