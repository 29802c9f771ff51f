"""A widget that is live while its work runs, then gives way to a static copy of its final
state, so that a finished cell holds no widget models in the kernel (nor in the notebook's
saved widget state) and frees its figures."""

from __future__ import annotations

import base64
from html import escape
from typing import Any

import ipywidgets

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class StaticView:
    """A finished widget as plain output: HTML for the notebook, text for a terminal."""

    def __init__(self, html: str, text: str) -> None:
        self.html = html
        self.text = text

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text


class LiveWidget:
    """Mixed into devlab's widgets (before an ipywidgets class): `display_live()` displays the
    widget under the cell with a display id; `release()` replaces that display by `static()`, the
    final state as plain HTML, and closes every widget model the widget is made of.

    The view is published as the widget's own display data, not through `display(widget)`:
    ipywidgets 7 (Colab) displays itself with `_ipython_display_`, which drops the display id.
    """

    _handle: Any = None
    _static: StaticView | None = None

    def display_live(self) -> None:
        """Display the live widget under the running cell (nothing outside IPython)."""
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.display import display

        if not InteractiveShell.initialized():
            return
        widget: Any = self
        bundle = {"text/plain": repr(self),
                  WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}}
        self._handle = display(bundle, raw=True, display_id=True)

    def static(self) -> StaticView:
        """The widget's current state as plain output (each widget says what it shows)."""
        raise NotImplementedError

    def release(self) -> StaticView:
        """Show the final state as static output where `display_live()` put the widget, then close the
        widget and every widget inside it. Safe to call twice."""
        if self._static is None:
            self._static = self.static()
            if self._handle is not None:
                self._handle.update(self._static)
            close_tree(self)  # type: ignore[arg-type]
            self._released()
        return self._static

    def _released(self) -> None:
        """Drop what only the live view needed (figures, caches)."""

    @property
    def released(self) -> bool:
        return self._static is not None

    def _repr_html_(self) -> str | None:
        # A released widget displayed again shows its final state (ipywidgets' own reprs
        # are gone once it is closed).
        return self._static.html if self._static is not None else None


def close_tree(widget: ipywidgets.Widget) -> None:
    """Close `widget` and every widget it holds in a synced trait (children, layout, style),
    in ipywidgets 7 and 8: each is a model in the kernel until closed."""
    seen: set[int] = set()

    def walk(w: Any) -> None:
        if isinstance(w, (list, tuple)):
            for item in w:
                walk(item)
            return
        if not isinstance(w, ipywidgets.Widget) or id(w) in seen:
            return
        seen.add(id(w))
        for key in list(w.keys):
            if key.startswith("_"):
                continue
            walk(getattr(w, key, None))
        w.close()

    walk(widget)


def png_of(out: ipywidgets.Output) -> str | None:
    """The base64 PNG an Output widget shows (as `show_png` put it there), if any."""
    for item in out.outputs:
        png = item.get("data", {}).get("image/png")
        if png:
            return png if isinstance(png, str) else base64.b64encode(png).decode("ascii")
    return None


def img(png_b64: str | None, alt: str) -> str:
    if not png_b64:
        return ""
    return f'<img src="data:image/png;base64,{png_b64}" alt="{escape(alt)}">'
