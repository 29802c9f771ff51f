"""Execute the lesson notebooks and write them as static HTML pages into site/.

A teacher reads a lesson, outputs and charts included, before opening it. Widgets (devlab's
live memory chart, progress bars) are drawn as their final state: nbclient records every
widget's state while the notebook runs, and `freeze_widgets` turns each widget view into
plain HTML from that state (an Output widget's chart becomes its PNG), so a page needs no
JavaScript, no widget manager and no network, and never shows "Loading widget...".

    python -m tools.render [--out DIR] [NOTEBOOK ...]     (scripts/render.sh)
"""

from __future__ import annotations

import argparse
import html
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import nbformat
from jinja2 import DictLoader
from nbclient import NotebookClient
from nbconvert import HTMLExporter
from nbconvert.filters import ansi2html

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SITE = ROOT / "site"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


# -- executing ------------------------------------------------------------------------------

def kernel_env() -> dict[str, str]:
    """This checkout's devlab, inline matplotlib, and no simulation switch from outside.

    Deliberately: a page shows what a learner without a GPU sees, the same wherever it is
    rendered. The lessons with the switch set are tested by tests/test_lessons.py."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    for name in ("DEVLAB_SIMULATE_GPUS", "DEVLAB_SIMULATE_GPU_MEMORY_MB", "DEVLAB_SIMULATE_GPU_MODEL"):
        env.pop(name, None)
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    return env


def execute(path: Path, timeout: int = 600) -> nbformat.NotebookNode:
    """Run the notebook top to bottom in a fresh python3 kernel, keeping widget state."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                            resources={"metadata": {"path": str(path.parent)}})
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(kernel_env())  # the kernel inherits the client's environment
    try:
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb


# -- widgets as their final state -----------------------------------------------------------

class MissingWidget(LookupError):
    """A widget view whose model the notebook did not record: it could not be drawn."""


def freeze_widgets(nb: nbformat.NotebookNode) -> int:
    """Replace every widget view in `nb` by static HTML of its final state; return how many.

    Removes the recorded widget state afterwards, so nbconvert adds no widget JavaScript.
    """
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    frozen = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW not in data:
                continue
            model_id = data[WIDGET_VIEW]["model_id"]
            out["data"] = {"text/html": _widget(model_id, state),
                           "text/plain": data.get("text/plain", "")}
            frozen += 1
    nb.metadata.pop("widgets", None)
    return frozen


def _widget(ref: str, state: Mapping[str, Any]) -> str:
    model_id = ref.removeprefix("IPY_MODEL_")
    if model_id not in state:
        raise MissingWidget(f"widget {model_id} has no recorded state")
    model = state[model_id]
    name, s = model["model_name"], model["state"]
    label = _description(s)
    if name in ("VBoxModel", "HBoxModel", "BoxModel", "GridBoxModel", "AccordionModel", "TabModel"):
        direction = "row" if name == "HBoxModel" else "column"
        inner = "".join(_widget(child, state) for child in s.get("children", []))
        return f'<div class="devlab-frozen-box" style="display:flex;flex-direction:{direction};gap:4px">{inner}</div>'
    if name == "OutputModel":
        return "".join(_output(o) for o in s.get("outputs", []))
    if name in ("HTMLModel", "HTMLMathModel"):
        return f"<div>{label}{s.get('value', '')}</div>"
    if name == "LabelModel":
        return f"<div>{label}{html.escape(str(s.get('value', '')))}</div>"
    if name in ("IntProgressModel", "FloatProgressModel"):
        value, top = s.get("value", 0), s.get("max", 100)
        return (f'<div>{label}<progress class="devlab-frozen-progress" value="{value}" '
                f'max="{top}"></progress></div>')
    if name == "ImageModel":
        fmt = s.get("format", "png")
        data = next((b["data"] for b in model.get("buffers", []) if b.get("path") == ["value"]), "")
        return f'<img src="data:image/{fmt};base64,{data}" alt="{html.escape(fmt)} image">'
    if name == "ButtonModel":
        return f"<button disabled>{html.escape(s.get('description', ''))}</button>"
    if "value" in s:  # sliders, text boxes, checkboxes, dropdowns: their final value
        return f"<div>{label}<code>{html.escape(str(s['value']))}</code></div>"
    return ""  # layouts and styles draw nothing by themselves


def _description(s: Mapping[str, Any]) -> str:
    text = s.get("description", "")
    return f"<span>{html.escape(text)} </span>" if text else ""


def _output(out: Mapping[str, Any]) -> str:
    kind = out.get("output_type")
    if kind == "stream":
        return f"<pre>{ansi2html(out.get('text', ''))}</pre>"
    if kind == "error":
        return f"<pre>{ansi2html(chr(10).join(out.get('traceback', [])))}</pre>"
    data = out.get("data", {})
    if WIDGET_VIEW in data:
        raise MissingWidget("a widget inside an Output widget is not drawn statically")
    for mime in ("image/png", "image/jpeg"):
        if mime in data:
            payload = data[mime].strip() if isinstance(data[mime], str) else data[mime]
            return f'<img src="data:{mime};base64,{payload}" alt="chart">'
    if "image/svg+xml" in data:
        return data["image/svg+xml"]
    if "text/html" in data:
        return data["text/html"]
    if "text/plain" in data:
        return f"<pre>{html.escape(data['text/plain'])}</pre>"
    return ""


# -- writing the site -------------------------------------------------------------------------

# JupyterLab's page, without the scripts it fetches from a CDN (require.js for widgets,
# MathJax, Mermaid): the lessons use neither maths nor diagrams, and a page must read offline.
_STATIC_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""


def to_html(nb: nbformat.NotebookNode, title: str) -> str:
    """The notebook as one self-contained page: nothing fetched from elsewhere."""
    exporter = HTMLExporter(template_name="lab", template_file="devlab-static.html.j2",
                            extra_loaders=[DictLoader({"devlab-static.html.j2": _STATIC_TEMPLATE})])
    page, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    return page


def render(names: list[str], out_dir: Path) -> dict[Path, nbformat.NotebookNode]:
    """Execute and write each notebook to `out_dir/<stem>.html`, plus an index page.

    Returns each page with the executed notebook it shows (widgets frozen)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pages = {}
    for name in names:
        nb = execute(NOTEBOOKS / name)
        freeze_widgets(nb)
        page = out_dir / f"{Path(name).stem}.html"
        page.write_text(to_html(nb, Path(name).stem), encoding="utf-8")
        pages[page] = nb
        print(f"wrote {page}", flush=True)
    (out_dir / "index.html").write_text(index_html(list(pages)), encoding="utf-8")
    return pages


def index_html(pages: list[Path]) -> str:
    items = "\n".join(f'<li><a href="{p.name}">{html.escape(p.stem)}</a></li>' for p in pages)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>devlab lessons</title>"
            f"</head><body><h1>devlab lessons, rendered</h1>\n<ul>\n{items}\n</ul></body></html>\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.render", description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", help="notebook file names (default: all)")
    parser.add_argument("--out", type=Path, default=SITE, help="output folder (default: site/)")
    args = parser.parse_args(argv)
    names = args.notebooks or sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    render(names, args.out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
