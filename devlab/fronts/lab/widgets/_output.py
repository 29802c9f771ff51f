"""Showing a PNG in an `Output` widget, safely from any thread."""

from __future__ import annotations

import base64

import ipywidgets


def show_png(out: ipywidgets.Output, png: bytes, alt: str) -> None:
    """Replace everything `out` shows with one PNG image.

    This sets the `outputs` trait directly instead of `with out:` + display: `with out:`
    redirects the whole kernel's output to the widget, so from a background thread it
    captures the cell's own prints, and two threads doing it at once broke nbclient.
    One assignment is one comm message, and the frontend swaps the image in place.
    """
    out.outputs = ({
        "output_type": "display_data",
        "data": {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": alt},
        "metadata": {},
    },)
