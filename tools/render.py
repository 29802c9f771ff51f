"""Execute the lesson notebooks and write them as static HTML pages into site/.

A teacher reads a lesson, outputs and charts included, before opening it, in English
(`site/<lesson>.html`) or in a translation (`site/<lang>/<lesson>.html`, from notebooks/<lang>/,
see tools/i18n.py, with the outputs of the English run: the same code), with a switch between
the languages at the top of every page; Persian pages read right to left (their markdown carries
`dir="rtl"`, and the page devlab's right-to-left stylesheet, the one its JupyterLab extension
loads: JupyterLab's own, which the page copies, aligns every paragraph to the left). Widgets (devlab's live memory chart, progress bars) are drawn as their final
state: nbclient records every widget's state while the notebook runs, and `freeze_widgets` turns
each widget view into plain HTML from that state (an Output widget's chart becomes its PNG), so
a page needs no JavaScript, no widget manager and no network, and never shows "Loading
widget...".

    python -m tools.render [--out DIR] [--lang LANG ...] [NOTEBOOK ...]     (scripts/render.sh)
"""

from __future__ import annotations

import argparse
import copy
import html
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import nbformat
from jinja2 import DictLoader
from nbclient import NotebookClient
from nbconvert import HTMLExporter
from nbconvert.filters import ansi2html

from tools.i18n import ENGLISH, LANGUAGES, Language, check_code

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SITE = ROOT / "site"
# devlab's stylesheet for right-to-left markdown, shared with its JupyterLab extension.
RTL_CSS = ROOT / "share" / "jupyter" / "labextensions" / "devlab-rtl" / "static" / "rtl.css"
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
    saved, env = dict(os.environ), kernel_env()  # read before the environment is cleared
    os.environ.clear()
    os.environ.update(env)  # the kernel inherits the client's environment
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
# Above the notebook: the switch between the lesson's languages.
_STATIC_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}<style type="text/css">""" + \
    """nav.devlab-languages{display:flex;gap:1em;padding:8px 16px;font-size:14px;""" + \
    """border-bottom:1px solid #ddd;font-family:var(--jp-ui-font-family,sans-serif)}""" + \
    """nav.devlab-languages [aria-current]{font-weight:bold;color:inherit;text-decoration:none}""" + \
    """</style>
<style type="text/css">{{ resources.devlab_rtl_css }}</style>{%- endblock extra_css -%}
{%- block body_header -%}{{ super() }}{{ resources.devlab_switch }}{%- endblock body_header -%}
"""
ALL_LANGUAGES = [ENGLISH, *LANGUAGES.values()]


def to_html(nb: nbformat.NotebookNode, title: str, lang: Language = ENGLISH,
            switch: str = "") -> str:
    """The notebook as one self-contained page: nothing fetched from elsewhere."""
    exporter = HTMLExporter(template_name="lab", template_file="devlab-static.html.j2",
                            extra_loaders=[DictLoader({"devlab-static.html.j2": _STATIC_TEMPLATE})],
                            language_code=lang.code)
    page, _ = exporter.from_notebook_node(nb, resources={
        "metadata": {"name": title}, "devlab_switch": switch,
        "devlab_rtl_css": RTL_CSS.read_text(encoding="utf-8")})
    return page


def source(name: str, lang: Language) -> Path:
    """The notebook a page shows: notebooks/<name>, or its translation notebooks/<lang>/<name>."""
    return NOTEBOOKS / name if lang is ENGLISH else NOTEBOOKS / lang.code / name


def page_path(out_dir: Path, name: str, lang: Language) -> Path:
    folder = out_dir if lang is ENGLISH else out_dir / lang.code
    return folder / f"{Path(name).stem}.html"


def title_of(path: Path) -> str:
    """The lesson's title in its own language: its first heading, else its file name."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return re.sub(r"<[^>]+>", "", line[2:]).strip()
    return path.stem


def languages_of(name: str) -> list[Language]:
    """The languages the lesson exists in: English and each translation built."""
    return [lang for lang in ALL_LANGUAGES if source(name, lang).exists()]


def switch_html(name: str, lang: Language) -> str:
    """Links to the same lesson in every language it exists in, each named in its own language."""
    here = page_path(Path("/"), name, lang).parent
    links = []
    for other in languages_of(name):
        target = os.path.relpath(page_path(Path("/"), name, other), here)
        current = ' aria-current="page"' if other is lang else ""
        links.append(f'<a href="{html.escape(target)}" hreflang="{other.code}" lang="{other.code}"'
                     f'{current}>{html.escape(other.name)}</a>')
    index = os.path.relpath("/index.html", here)
    return (f'<nav class="devlab-languages" aria-label="Language" dir="ltr">'
            f'<a href="{index}">devlab lessons</a> · {" ".join(links)}</nav>')


def render(names: list[str], out_dir: Path, languages: list[Language] | None = None,
           run_english: Callable[[Path], nbformat.NotebookNode] | None = None,
           ) -> dict[Path, nbformat.NotebookNode]:
    """Execute each English notebook and write it, in each of `languages` (default: all it
    exists in; a translation with the English run's outputs, `as_translated`), to
    `out_dir/[<lang>/]<stem>.html`, plus an index page of every lesson in every language.
    `run_english` executes a notebook as `execute` does (widget state kept, `kernel_env`; the
    tests pass one that shares its run with tests/test_lessons.py's). Returns each page with
    the executed notebook it shows (widgets frozen)."""
    run_english = run_english or execute
    out_dir.mkdir(parents=True, exist_ok=True)
    pages = {}
    for name in names:
        english_run = None
        for lang in languages_of(name):
            if languages is not None and lang not in languages:
                continue
            english_run = english_run or run_english(source(name, ENGLISH))
            nb = copy.deepcopy(english_run) if lang is ENGLISH else as_translated(
                english_run, nbformat.read(source(name, lang), as_version=4))
            freeze_widgets(nb)
            page = page_path(out_dir, name, lang)
            page.parent.mkdir(parents=True, exist_ok=True)
            title = title_of(source(name, lang))
            page.write_text(to_html(nb, title, lang, switch_html(name, lang)), encoding="utf-8")
            pages[page] = nb
            print(f"wrote {page}", flush=True)
    (out_dir / "index.html").write_text(index_html(names), encoding="utf-8")
    return pages


def as_translated(english_run: nbformat.NotebookNode,
                  translation: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A translation's page: its own cells, each code cell with the outputs of the English
    cell of the same id in `english_run`, and that run's widget state. Its code is the English
    code token for token (tools/i18n.py checks it, and this refuses a notebook where it is
    not), so these are its outputs: running it again would only take the time. The translation
    itself runs in a kernel in tests/test_lessons.py."""
    problems = check_code(english_run, translation, Path("translation"), executed=True)
    if problems:
        raise ValueError("; ".join(p.what for p in problems))
    page = copy.deepcopy(translation)
    for cell, ran in zip(page.cells, english_run.cells, strict=True):
        if cell.cell_type == "code":
            cell.outputs = copy.deepcopy(ran.outputs)
            cell.execution_count = ran.execution_count
    if "widgets" in english_run.metadata:
        page.metadata["widgets"] = copy.deepcopy(english_run.metadata["widgets"])
    return page


def _lang_attrs(lang: Language) -> str:
    """lang, and dir for a right-to-left language: a title such as «GPUها — ...» laid out right
    to left, aligned to the right, its quotes on their own sides."""
    return f'lang="{lang.code}"' + (' dir="rtl"' if lang.rtl else "")


def index_html(names: list[str]) -> str:
    """A table of the lessons, one column per language."""
    head = "".join(f'<th {_lang_attrs(lang)}>{html.escape(lang.name)}</th>'
                   for lang in ALL_LANGUAGES)
    rows = []
    for name in names:
        cells = "".join(
            f'<td {_lang_attrs(lang)}><a href="{page_path(Path("."), name, lang).as_posix()}" '
            f'hreflang="{lang.code}">{html.escape(title_of(source(name, lang)))}</a></td>'
            if lang in languages_of(name) else "<td></td>" for lang in ALL_LANGUAGES)
        rows.append(f"<tr>{cells}</tr>")
    body = "\n".join(rows)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>devlab "
            f"lessons</title><style>td, th {{ text-align: start; padding: 0.2em 0.6em; }}</style>"
            f"</head><body><h1>devlab lessons, rendered</h1>\n<table>\n<tr>{head}</tr>"
            f"\n{body}\n</table></body></html>\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.render", description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", help="notebook file names (default: all)")
    parser.add_argument("--out", type=Path, default=SITE, help="output folder (default: site/)")
    codes = [lang.code for lang in ALL_LANGUAGES]
    parser.add_argument("--lang", action="append", choices=codes,
                        help=f"only this language (repeatable; default: all of {', '.join(codes)})")
    args = parser.parse_args(argv)
    names = args.notebooks or sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    languages = [lang for lang in ALL_LANGUAGES if lang.code in args.lang] if args.lang else None
    render(names, args.out.resolve(), languages)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
