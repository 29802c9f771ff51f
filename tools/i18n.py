"""The lessons in Japanese, Korean and Persian: gettext catalogs keyed to the English notebooks.

The English notebooks in notebooks/ are the one source of code. Their translatable text, each
markdown cell whole and each comment in a code cell (a block of full-line comments as one
entry), is a gettext message whose msgid is the English text; each language's translations of
one notebook live in `i18n/<notebook stem>/<lang>.po`, and `build` writes them, with the
English notebook's code, into `notebooks/<lang>/<notebook>.ipynb`. Changing an English cell
changes its msgid, so its translation cannot silently stay: `update` marks it fuzzy (stale:
the old translation is kept for the translator to revise, with the old English beside it as
`#| msgid`) or adds it untranslated, and `check` fails until someone has looked again.

    python -m tools.i18n extract [NOTEBOOK ...]   write i18n/<stem>/<stem>.pot
    python -m tools.i18n update  [NOTEBOOK ...]   merge it into every <lang>.po (stale: fuzzy)
    python -m tools.i18n build   [NOTEBOOK ...]   write notebooks/<lang>/*.ipynb (--draft: even
                                                  with stale or missing translations)
    python -m tools.i18n check                    list every problem; exit 1 if there is one

Persian is written right to left: its markdown is built inside `<div dir="rtl" ...>` (with blank
lines around the markdown, so JupyterLab, nbconvert and GitHub still parse it), code blocks
are kept outside it, left to right, and every inline code span is a left-to-right isolate
(`<span dir="ltr">`). Its code comments stay in English, as the published Persian TensorFlow
guide keeps them: a code line runs left to right, so a comment mixing Persian with Latin words
(`GPUها`, a device name) would display out of order. `update` fills them in with the English
text and `check` fails on any other. JupyterLab aligns the right-to-left prose to the right with
devlab's extension (share/jupyter/labextensions/devlab-rtl), the rendered site with the same
stylesheet. docs/translation-<lang>.md is each language's guide: terms, register, what stays
in English.
"""

from __future__ import annotations

import argparse
import copy
import io
import re
import sys
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import polib

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
CATALOGS = ROOT / "i18n"
WIDTH = 100  # .po line width: long markdown paragraphs wrap, as the repository's code does


@dataclass(frozen=True)
class Language:
    code: str  # BCP 47 / gettext code, and the folder name under notebooks/
    name: str  # the language's own name, for the site's switch and the README
    english: str
    rtl: bool = False
    # Code comments left in English (msgstr = msgid): for a right-to-left language, whose words
    # a left-to-right code line would display out of order.
    english_comments: bool = False


LANGUAGES = {
    "ja": Language("ja", "日本語", "Japanese"),
    "ko": Language("ko", "한국어", "Korean"),
    "fa": Language("fa", "فارسی", "Persian", rtl=True, english_comments=True),
}
ENGLISH = Language("en", "English", "English")

# Comments that are markers for tools, not prose: kept as they are, never translated.
_MARKER = re.compile(r"#\s*(@\w+|noqa\b|type:|pragma\b|fmt:|!)")
# Cell magics whose body is not Python: no comments are read from it, and it is compared as text.
_TEXT_CELL_MAGICS = {"bash", "sh", "script", "writefile", "file", "html", "javascript", "js",
                     "latex", "markdown", "svg", "perl", "ruby", "python2", "sx", "system"}
# Around inline code in right-to-left prose. An element with a `dir` attribute is a bidi
# isolate (HTML's rendering rules), so `/GPU:1` or `f(2)` keeps its order inside a Persian line;
# the markdown code span inside stays as it was. (Unicode's isolate characters would do the
# same, but bidi control characters in a file make GitHub and linters warn of hidden text.)
LTR_OPEN, LTR_CLOSE = '<span dir="ltr">', "</span>"
# Around right-to-left prose. The inline alignment is for renderers whose stylesheet aligns the
# cell itself to the left (as far as a notebook can reach in Colab); JupyterLab's sets it on
# every paragraph, which only a stylesheet can undo (devlab's extension, devlab-rtl).
RTL_OPEN, RTL_CLOSE = '<div dir="rtl" style="text-align: right">', "</div>"


# -- what is translated ---------------------------------------------------------------------

@dataclass(frozen=True)
class Comment:
    """A comment in a code cell: one inline comment, or a block of full-line comments."""

    first: int  # 0-based line numbers in the cell's source
    last: int
    column: int  # where `#` is
    text: str  # without `#` and the one space after it; a block's lines joined by "\n"
    inline: bool  # after code on the same line


@dataclass(frozen=True)
class Unit:
    """One message of a notebook: a markdown cell or a comment, and where it is."""

    text: str
    cell: int  # index in the notebook (0-based; shown to translators 1-based)
    cell_id: str
    comment: Comment | None = None

    @property
    def where(self) -> str:
        if self.comment is None:
            return f"markdown cell {self.cell + 1} (id {self.cell_id})"
        kind = "inline comment" if self.comment.inline else "comment"
        return (f"{kind} in code cell {self.cell + 1} (id {self.cell_id}), "
                f"line {self.comment.first + 1}")


def is_magic(line: str) -> bool:
    """A line IPython reads itself: a line or cell magic, or a shell escape."""
    return line.lstrip().startswith(("%", "!"))


def text_magic(source: str) -> bool:
    """A cell whose cell magic takes a body that is not Python (%%bash, %%writefile...)."""
    first = source.split("\n", 1)[0]
    return first.startswith("%%") and first[2:].split(" ", 1)[0] in _TEXT_CELL_MAGICS


def _python_lines(source: str) -> list[str]:
    """The cell's lines with IPython's own lines blanked, so that tokenize reads the rest."""
    return ["\n" if is_magic(line) else line for line in source.splitlines(keepends=True)]


def _tokens(source: str, where: str) -> list[tokenize.TokenInfo]:
    text = "".join(_python_lines(source))
    if text and not text.endswith("\n"):
        text += "\n"
    try:
        return list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError) as e:
        raise ValueError(f"{where}: the code cannot be read as Python ({e}); a cell whose "
                         "body is not Python needs its cell magic in _TEXT_CELL_MAGICS") from None


def comments(source: str, where: str = "a code cell") -> list[Comment]:
    """The translatable comments of a code cell, in order."""
    if text_magic(source):
        return []
    lines = source.splitlines()
    found: list[Comment] = []
    for tok in _tokens(source, where):
        if tok.type != tokenize.COMMENT or _MARKER.match(tok.string):
            continue
        row, col = tok.start[0] - 1, tok.start[1]
        text = re.sub(r"^# ?", "", tok.string).rstrip()
        inline = bool(lines[row][:col].strip())
        last = found[-1] if found else None
        if (not inline and last is not None and not last.inline and last.last == row - 1
                and last.column == col):
            found[-1] = Comment(last.first, row, col, f"{last.text}\n{text}", False)
        else:
            found.append(Comment(row, row, col, text, inline))
    return found


def units(nb: nbformat.NotebookNode, name: str = "notebook") -> list[Unit]:
    """Every translatable text of an English notebook, in order."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and cell.source.strip():
            found.append(Unit(cell.source, i, cell.get("id", "")))
        elif cell.cell_type == "code":
            for c in comments(cell.source, f"{name}, code cell {i}"):
                if c.text.strip():
                    found.append(Unit(c.text, i, cell.get("id", ""), c))
    return found


# -- catalogs -----------------------------------------------------------------------------------

def english_notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def catalog_dir(notebook: Path) -> Path:
    return CATALOGS / notebook.stem


def template_path(notebook: Path) -> Path:
    return catalog_dir(notebook) / f"{notebook.stem}.pot"


def catalog_path(notebook: Path, lang: str) -> Path:
    return catalog_dir(notebook) / f"{lang}.po"


def built_path(notebook: Path, lang: str) -> Path:
    return NOTEBOOKS / lang / notebook.name


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M+0000")


def _catalog(header: str, **metadata: str) -> polib.POFile:
    cat = polib.POFile(wrapwidth=WIDTH, check_for_duplicates=True)
    cat.header = header
    cat.metadata = {"Project-Id-Version": "devlab lessons", "POT-Creation-Date": _now(),
                    **metadata, "MIME-Version": "1.0",
                    "Content-Type": "text/plain; charset=UTF-8",
                    "Content-Transfer-Encoding": "8bit"}
    return cat


def template(notebook: Path) -> polib.POFile:
    """The notebook's messages as a gettext template (msgid = English, msgstr empty)."""
    nb = nbformat.read(notebook, as_version=4)
    pot = _catalog(f"Translatable text of notebooks/{notebook.name}: its markdown cells and "
                   f"code comments.\nWritten by python -m tools.i18n extract; do not edit.")
    entries: dict[str, polib.POEntry] = {}
    for unit in units(nb, notebook.name):
        # Where: the notebook and the cell's number, from 1 (a .po location's "line").
        where = (f"notebooks/{notebook.name}", str(unit.cell + 1))
        if unit.text in entries:
            entries[unit.text].occurrences.append(where)
            entries[unit.text].comment += f"\n{unit.where}"
        else:
            entries[unit.text] = polib.POEntry(msgid=unit.text, msgstr="", occurrences=[where],
                                               comment=unit.where)
            pot.append(entries[unit.text])
    return pot


def _header(notebook: Path, lang: Language) -> str:
    return (f"{lang.english} translation of notebooks/{notebook.name} (devlab's lessons).\n"
            f"msgid is the English text of a markdown cell or a code comment; python -m tools.i18n\n"
            f"build writes notebooks/{lang.code}/{notebook.name} from this catalog.\n"
            f"Terms follow the published {lang.english} translations of TensorFlow's guide "
            f"\"Use a GPU\"\n(The TensorFlow Authors, CC BY 4.0)"
            + (" and of Dive into Deep Learning's chapter \"GPUs\"\n(d2l.ai authors, "
               "CC BY-SA 4.0)" if lang.code == "ja" else "") + ".\n"
            f"Terms, register and what stays in English: docs/translation-{lang.code}.md.")


def load(path: Path) -> polib.POFile:
    return polib.pofile(str(path), wrapwidth=WIDTH, encoding="utf-8")


def save(cat: polib.POFile, path: Path) -> None:
    """Write a catalog only if its text changed (so an idle update touches nothing)."""
    cat.wrapwidth = WIDTH
    text = str(cat) + "\n"
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _messages(cat: polib.POFile) -> list[tuple[str, list[tuple[str, str]], str]]:
    return [(e.msgid, e.occurrences, e.comment) for e in cat if not e.obsolete]


def extract(notebook: Path) -> polib.POFile:
    """Write the notebook's template; keep its creation date if its messages did not change."""
    pot = template(notebook)
    path = template_path(notebook)
    if path.exists():
        old = load(path)
        if _messages(old) == _messages(pot):
            pot.metadata["POT-Creation-Date"] = old.metadata.get("POT-Creation-Date", _now())
    save(pot, path)
    return pot


def update(notebook: Path, lang: Language) -> polib.POFile:
    """Merge the notebook's current English text into the language's catalog, as gettext's
    msgmerge does, by Babel's `Catalog.update`.

    A msgid no longer in the notebook is matched to its closest new text (difflib's ratio of at
    least 0.6, as msgmerge), whose entry then keeps the old translation, flagged fuzzy, with the
    old English beside it (`#| msgid`): stale until a translator revises it and removes the
    flag. New text the language's other catalogs have translated word for word (the set-up
    cell's comment, say) gets that translation, fuzzy too, to be checked in its new place; any
    other new text is untranslated. The files are read and written by polib, whose output the
    catalogs keep (Babel's writer would drop their own headers, `X-Reviewed`, and rewrap them)."""
    pot = extract(notebook)
    path = catalog_path(notebook, lang.code)
    if path.exists():
        old = load(path)
        cat = _catalog(old.header, **{k: v for k, v in old.metadata.items()
                                      if k not in ("MIME-Version", "Content-Type",
                                                   "Content-Transfer-Encoding")})
    else:
        old = None
        cat = _catalog(_header(notebook, lang), **{
            "PO-Revision-Date": _now(), "Last-Translator": "devlab maintainers",
            "Language-Team": f"{lang.english} <devlab lessons>", "Language": lang.code})
    cat.metadata["POT-Creation-Date"] = pot.metadata["POT-Creation-Date"]
    known = {e.msgid: e for e in old if not e.obsolete} if old is not None else {}
    merged = _babel(known.values())
    merged.update(_babel(pot), update_creation_date=False)
    memory = translation_memory(lang, besides=notebook)
    comment_ids = {u.text for u in units(nbformat.read(notebook, as_version=4), notebook.name)
                   if u.comment is not None}
    for t in pot:
        entry = polib.POEntry(msgid=t.msgid, msgstr="", occurrences=t.occurrences,
                              comment=t.comment)
        message = merged[t.msgid]
        if lang.english_comments and t.msgid in comment_ids:
            entry.msgstr = t.msgid  # stays English: nothing for a translator to do
        elif message.string:
            was = known[message.previous_id[0]] if message.previous_id else known[t.msgid]
            entry.msgstr, entry.tcomment = message.string, "\n".join(message.user_comments)
            entry.flags = [f for f in was.flags if f in message.flags] + sorted(
                message.flags - set(was.flags) - {"python-format", "python-brace-format"})
            # The English the translation was made from: the older one if it was stale already
            # (Babel keeps only the last).
            entry.previous_msgid = (was.previous_msgid if was.fuzzy and was.previous_msgid
                                    else message.previous_id[0] if message.previous_id
                                    else None)
        elif t.msgid in memory:
            entry.msgstr, entry.flags = memory[t.msgid], ["fuzzy"]
        cat.append(entry)
    unchanged = old is not None and _contents(cat) == _contents(old)
    cat.metadata["PO-Revision-Date"] = (old.metadata.get("PO-Revision-Date", _now())
                                        if old is not None and unchanged else _now())
    save(cat, path)
    return cat


def _babel(entries: Iterable[polib.POEntry]):
    """polib's entries as a Babel `Catalog`, for its merge."""
    from babel.messages.catalog import Catalog

    cat = Catalog(fuzzy=False)
    for e in entries:
        cat.add(e.msgid, e.msgstr, flags=e.flags,
                user_comments=e.tcomment.split("\n") if e.tcomment else (),
                previous_id=e.previous_msgid or ())
    return cat


def _contents(cat: polib.POFile) -> list[tuple[object, ...]]:
    return [(e.msgid, e.msgstr, sorted(e.flags), e.previous_msgid, e.occurrences, e.comment)
            for e in cat if not e.obsolete]


def translation_memory(lang: Language, besides: Path) -> dict[str, str]:
    """The language's reviewed translations in the other notebooks' catalogs, by msgid."""
    memory: dict[str, str] = {}
    for path in sorted(CATALOGS.glob(f"*/{lang.code}.po")):
        if path.parent.name != besides.stem:
            memory.update({e.msgid: e.msgstr for e in load(path)
                           if e.msgstr and not e.fuzzy and not e.obsolete})
    return memory


# -- building the translated notebooks ------------------------------------------------------------

class Incomplete(Exception):
    """A catalog with stale (fuzzy) or missing translations, built without --draft."""


def translation(cat: polib.POFile, unit: Unit, draft: bool) -> str:
    message = cat.find(unit.text)
    if message is None or not message.msgstr:
        if draft:
            return unit.text
        raise Incomplete(f"no translation for the {unit.where}")
    if message.fuzzy and not draft:
        raise Incomplete(f"the translation of the {unit.where} is stale (fuzzy)")
    return message.msgstr


def build(notebook: Path, lang: Language, cat: polib.POFile | None = None,
          draft: bool = False) -> nbformat.NotebookNode:
    """The translated notebook: the English one's cells, ids, metadata and code, with its
    markdown cells and comments replaced by the catalog's translations. No outputs."""
    if cat is None:
        path = catalog_path(notebook, lang.code)
        if not path.exists():
            raise Incomplete(f"no catalog yet: run python -m tools.i18n update {notebook.name}")
        cat = load(path)
    english = nbformat.read(notebook, as_version=4)
    nb = copy.deepcopy(english)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    by_cell: dict[int, list[Unit]] = {}
    for unit in units(english, notebook.name):
        by_cell.setdefault(unit.cell, []).append(unit)
    for i, found in by_cell.items():
        cell = nb.cells[i]
        if cell.cell_type == "markdown":
            text = relocate_links(translation(cat, found[0], draft))
            cell.source = rtl_markdown(text) if lang.rtl else text
        else:
            cell.source = with_comments(cell.source, [
                (u.comment, translation(cat, u, draft)) for u in found if u.comment])
    nb.metadata["devlab_i18n"] = {
        "language": lang.code,
        "built_from": f"../{notebook.name}",
        "catalog": f"../../i18n/{notebook.stem}/{lang.code}.po",
        "note": "Built by `python -m tools.i18n build`: change the English notebook or the "
                "catalog, not this file.",
    }
    return nb


def with_comments(source: str, replaced: list[tuple[Comment, str]]) -> str:
    """`source` with each comment's text replaced (a block by as many lines as it needs)."""
    lines = source.split("\n")
    for c, text in sorted(replaced, key=lambda r: r[0].first, reverse=True):
        if c.inline:
            if "\n" in text:
                raise ValueError(f"the translation of the inline comment on line {c.first + 1} "
                                 "has more than one line")
            lines[c.first] = lines[c.first][:c.column] + _comment_line(text)
        else:
            indent = lines[c.first][:c.column]
            lines[c.first:c.last + 1] = [indent + _comment_line(t) for t in text.split("\n")]
    return "\n".join(lines)


def _comment_line(text: str) -> str:
    return f"# {text}".rstrip()


_LINK = re.compile(r"(\]\(\s*<?|\b(?:href|src)=\")([^)\s\">]+)")
_SCHEME = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|#|/)")


def relocate_links(text: str) -> str:
    """Relative links as seen from notebooks/<lang>/, one folder deeper than the English."""
    return _LINK.sub(lambda m: m[1] + (m[2] if _SCHEME.match(m[2]) else f"../{m[2]}"), text)


_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})")


# Where the fenced blocks and code spans are (which `rtl_markdown` needs to rewrite the text
# around them): mistune's AST says what they hold, not where in the text they are.
def fenced_blocks(text: str) -> list[tuple[int, int, int]]:
    """Fenced code blocks of a markdown text: (first line, last line, indent), 0-based."""
    lines = text.split("\n")
    blocks, open_at, fence, indent = [], None, "", 0
    for i, line in enumerate(lines):
        m = _FENCE.match(line)
        if open_at is None and m:
            open_at, fence, indent = i, m[2], len(m[1])
        elif open_at is not None and m and m[2][0] == fence[0] and len(m[2]) >= len(fence) \
                and not line[m.end():].strip():
            blocks.append((open_at, i, indent))
            open_at = None
    if open_at is not None:
        blocks.append((open_at, len(lines) - 1, indent))
    return blocks


def code_spans(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of every inline code span outside fenced blocks, CommonMark's way: a run
    of n backticks up to the next run of exactly n."""
    i, n = 0, len(text)
    while i < n:
        if text[i] == "\\":
            i += 2
            continue
        if text[i] != "`":
            i += 1
            continue
        j = i
        while j < n and text[j] == "`":
            j += 1
        run = j - i
        k = j
        while True:
            k = text.find("`" * run, k)
            if k < 0:
                i = j  # no closing run: the backticks are literal
                break
            end = k + run
            if (end < n and text[end] == "`") or text[k - 1] == "`":
                while k < n and text[k] == "`":
                    k += 1
                continue
            yield i, end
            i = end
            break


def _isolate_code(prose: str) -> str:
    out, last = [], 0
    for start, end in code_spans(prose):
        out += [prose[last:start], LTR_OPEN, prose[start:end], LTR_CLOSE]
        last = end
    out.append(prose[last:])
    return "".join(out)


def rtl_markdown(text: str) -> str:
    """Markdown written right to left: prose inside `RTL_OPEN`, blank lines inside the
    div so the markdown in it is still parsed, fenced code blocks outside it (left to right),
    and each inline code span (device names, API names, values) a left-to-right isolate.
    JupyterLab's sanitizer keeps `dir` on every element."""
    lines = text.split("\n")
    pieces: list[str] = []
    start = 0
    for first, last, indent in fenced_blocks(text):
        if indent:
            raise ValueError("an indented code block cannot leave a right-to-left paragraph: "
                             "put it at the top level of the cell")
        pieces.append(_rtl_div("\n".join(lines[start:first])))
        pieces.append("\n".join(lines[first:last + 1]))
        start = last + 1
    pieces.append(_rtl_div("\n".join(lines[start:])))
    return "\n\n".join(p for p in pieces if p)


def _rtl_div(prose: str) -> str:
    prose = prose.strip("\n")
    if not prose.strip():
        return ""
    return f"{RTL_OPEN}\n\n{_isolate_code(prose)}\n\n{RTL_CLOSE}"


def english_view(translated: nbformat.NotebookNode,
                 english: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """An executed translated notebook with the English notebook's cell sources and its own
    outputs: what tests written for the English lesson read (their cells found by code that
    may carry a comment). Only for notebooks whose code is the English code (`check_code`)."""
    problems = check_code(english, translated, Path("translated notebook"), executed=True)
    if problems:
        raise ValueError("; ".join(p.what for p in problems))
    view = copy.deepcopy(translated)
    for cell, source in zip(view.cells, english.cells, strict=True):
        cell.source = source.source
    return view


# -- checks ------------------------------------------------------------------------------------------

def code_signature(source: str, where: str = "a code cell") -> list[tuple[str, str]]:
    """What must be identical between a notebook and its translation: the code's tokens
    without comments and blank lines, and IPython's own lines (magics, `!`) as text."""
    if text_magic(source):
        return [("text", source)]
    lines = source.splitlines()
    magic_rows = {i for i, line in enumerate(lines) if is_magic(line)}
    sig: list[tuple[int, tuple[str, str]]] = [(i, ("magic", lines[i].rstrip())) for i in magic_rows]
    for tok in _tokens(source, where):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENDMARKER):
            continue
        string = "" if tok.type == tokenize.NEWLINE else tok.string
        sig.append((tok.start[0] - 1, (tokenize.tok_name[tok.type], string)))
    # Stable: a magic line comes before the tokens of any later line.
    return [item for _, item in sorted(sig, key=lambda s: s[0])]


_HTML_LINK = re.compile(r"""\b(?:href|src)=["']([^"']+)""")


def _markdown_ast(text: str) -> list[dict]:
    import mistune

    return mistune.create_markdown(renderer="ast")(text)


def _nodes(nodes: list[dict]) -> Iterator[dict]:
    for node in nodes:
        yield node
        yield from _nodes(node.get("children", []))


def markdown_facts(text: str) -> dict[str, set]:
    """What a translation of a markdown cell must keep, as a CommonMark parser (mistune, as
    nbconvert uses) reads it: inline code, fenced code (info string and code), links (markdown
    links and images, and `href`/`src` in inline HTML)."""
    facts: dict[str, set] = {"code": set(), "blocks": set(), "links": set()}
    for node in _nodes(_markdown_ast(text)):
        kind = node["type"]
        if kind == "codespan":
            facts["code"].add(node["raw"].strip())
        elif kind == "block_code" and node.get("style") == "fenced":
            facts["blocks"].add((node.get("attrs", {}).get("info", ""), node["raw"]))
        elif kind in ("link", "image"):
            facts["links"].add(node["attrs"]["url"])
        elif kind in ("inline_html", "block_html"):
            facts["links"].update(_HTML_LINK.findall(node["raw"]))
    return facts


def markdown_shape(text: str) -> dict[str, object]:
    """A markdown text's structure as a CommonMark parser (mistune, as nbconvert uses) reads it:
    its headings' levels, how many list items, and any `*` left as text, which is emphasis
    that did not parse (CommonMark's flanking rules can leave it so beside CJK punctuation)."""
    nodes = list(_nodes(_markdown_ast(text)))
    return {"headings": [n["attrs"]["level"] for n in nodes if n["type"] == "heading"],
            "items": sum(n["type"] == "list_item" for n in nodes),
            "stars": [n["raw"] for n in nodes if n["type"] == "text" and "*" in n.get("raw", "")]}


@dataclass(frozen=True)
class Problem:
    path: Path
    what: str

    def __str__(self) -> str:
        try:
            where = self.path.relative_to(ROOT)
        except ValueError:
            where = self.path
        return f"{where}: {self.what}"


# Letters of right-to-left scripts (Hebrew, Arabic and Persian, Syriac, Thaana, N'Ko...).
RTL_LETTERS = re.compile("[\u0590-\u08ff\ufb1d-\ufdff\ufe70-\ufefc]")


def check_translation(unit: Unit, text: str, lang: Language | None = None) -> list[str]:
    """What is wrong with one translation, besides being stale or missing."""
    if unit.comment is not None:
        if lang is not None and lang.english_comments and text != unit.text:
            return [f"a code comment in {lang.english} stays in English, as the published "
                    f"{lang.english} TensorFlow guide keeps it (a code line runs left to right, "
                    f"so right-to-left words in it display out of order): run python -m "
                    f"tools.i18n update, or write the English text"]
        if lang is not None and lang.rtl and RTL_LETTERS.search(text):
            return ["a code comment in right-to-left script displays out of order in a "
                    "left-to-right code line: keep it in English"]
        return ["an inline comment's translation must be one line"] \
            if unit.comment.inline and "\n" in text else []
    want, got = markdown_facts(unit.text), markdown_facts(text)
    wrong = []
    for key, label in (("code", "inline code"), ("blocks", "code blocks")):
        if got[key] != want[key]:
            lost, added = sorted(want[key] - got[key]), sorted(got[key] - want[key])
            wrong.append(f"its {label} differs from the English: missing {lost}, added {added}")
    if not want["links"] <= got["links"]:
        wrong.append(f"it lost the English links {sorted(want['links'] - got['links'])}")
    english, translated = markdown_shape(unit.text), markdown_shape(text)
    if translated["headings"] != english["headings"]:
        wrong.append(f"its headings (levels {translated['headings']}) are not the English "
                     f"ones ({english['headings']})")
    if translated["items"] != english["items"]:
        wrong.append(f"it has {translated['items']} list items, the English {english['items']}")
    if translated["stars"] and not english["stars"]:
        wrong.append(f"an emphasis did not parse, `*` shows as text: {translated['stars'][0]!r}")
    return wrong


def check_catalog(notebook: Path, lang: Language) -> list[Problem]:
    path = catalog_path(notebook, lang.code)
    if not path.exists():
        return [Problem(path, f"missing: run python -m tools.i18n update {notebook.name}")]
    cat = load(path)
    english = nbformat.read(notebook, as_version=4)
    wanted = units(english, notebook.name)
    ids = {u.text for u in wanted}
    problems = []
    have = {e.msgid for e in cat if not e.obsolete}
    if have != ids:
        problems.append(Problem(path, f"not updated to the English notebook ({len(ids - have)} "
                                      f"new or changed texts, {len(have - ids)} gone): run "
                                      f"python -m tools.i18n update {notebook.name}"))
    if cat.metadata.get("Language") != lang.code:
        problems.append(Problem(path, f"its Language header is {cat.metadata.get('Language')!r}, "
                                      f"not {lang.code!r}"))
    for unit in wanted:
        message = cat.find(unit.text)
        if message is None:
            continue
        if not message.msgstr:
            problems.append(Problem(path, f"untranslated: the {unit.where}: {_short(unit.text)}"))
        elif message.fuzzy:
            problems.append(Problem(path, f"stale (fuzzy): the English {unit.where} changed; "
                                          f"revise the translation, then remove the fuzzy flag: "
                                          f"{_short(unit.text)}"))
        else:
            problems += [Problem(path, f"the {unit.where}: {w}")
                         for w in check_translation(unit, message.msgstr, lang)]
    return problems


def _short(text: str, n: int = 70) -> str:
    line = " ".join(text.split())
    return repr(line if len(line) <= n else line[:n - 1] + "…")


def check_code(english: nbformat.NotebookNode, translated: nbformat.NotebookNode,
               path: Path, executed: bool = False) -> list[Problem]:
    """A translated notebook has the English one's cells, code and metadata, and no outputs
    (`executed`: a notebook that has run, with outputs and execution metadata of its own)."""
    if [c.cell_type for c in english.cells] != [c.cell_type for c in translated.cells]:
        return [Problem(path, "its cells are not the English notebook's (count or kinds)")]
    problems = []
    for i, (en, tr) in enumerate(zip(english.cells, translated.cells, strict=True)):
        same_metadata = executed or en.metadata == tr.metadata
        if en.get("id") != tr.get("id") or not same_metadata:
            problems.append(Problem(path, f"cell {i + 1}: id or metadata differs from the English"))
        if en.cell_type != "code":
            continue
        where = f"{path.name}, code cell {i + 1}"
        if code_signature(en.source, where) != code_signature(tr.source, where):
            problems.append(Problem(path, f"code cell {i + 1}: the code differs from the English "
                                          f"notebook's (comments aside)"))
        if not executed and (tr.get("outputs") or tr.get("execution_count") is not None):
            problems.append(Problem(path, f"code cell {i + 1} has outputs; lessons are kept "
                                          "without"))
    return problems


def check_built(notebook: Path, lang: Language) -> list[Problem]:
    path = built_path(notebook, lang.code)
    if not path.exists():
        return [Problem(path, "missing: run python -m tools.i18n build")]
    english = nbformat.read(notebook, as_version=4)
    translated = nbformat.read(path, as_version=4)
    problems = check_code(english, translated, path)
    try:
        expected = nbformat.writes(build(notebook, lang)) + "\n"
    except (Incomplete, ValueError, OSError):
        return problems  # the catalog's own problems say why
    if path.read_text(encoding="utf-8") != expected:
        problems.append(Problem(path, "out of date with its catalog or the English notebook: "
                                      "run python -m tools.i18n build"))
    return problems


def check_template(notebook: Path) -> list[Problem]:
    path = template_path(notebook)
    if not path.exists() or _messages(load(path)) != _messages(template(notebook)):
        return [Problem(path, f"out of date: run python -m tools.i18n update {notebook.name}")]
    return []


def check(notebooks: Iterable[Path] | None = None,
          languages: Iterable[Language] | None = None) -> list[Problem]:
    """Every problem with the translations: missing, stale, untranslated or wrong entries;
    built notebooks missing, out of date, or with code unlike the English; leftovers."""
    notebooks = list(notebooks) if notebooks is not None else english_notebooks()
    languages = list(languages) if languages is not None else list(LANGUAGES.values())
    problems: list[Problem] = []
    for notebook in notebooks:
        problems += check_template(notebook)
        for lang in languages:
            problems += check_catalog(notebook, lang)
            problems += check_built(notebook, lang)
    stems = {n.stem for n in english_notebooks()}
    for lang in languages:
        for path in sorted((NOTEBOOKS / lang.code).glob("*.ipynb")):
            if path.stem not in stems:
                problems.append(Problem(path, "no English notebook of this name: remove it"))
    for folder in sorted(p for p in CATALOGS.glob("*") if p.is_dir()):
        if folder.name not in stems:
            problems.append(Problem(folder, "catalogs of a notebook that no longer exists"))
    return problems


# -- command line ----------------------------------------------------------------------------------

def _chosen(names: list[str]) -> list[Path]:
    if not names:
        return english_notebooks()
    paths = []
    for name in names:
        path = NOTEBOOKS / Path(name).name
        if path.suffix != ".ipynb" or not path.exists():
            known = ", ".join(p.name for p in english_notebooks())
            raise SystemExit(f"no English notebook {name!r} in notebooks/ (there are: {known})")
        paths.append(path)
    return paths


def _languages(codes: list[str] | None) -> list[Language]:
    if not codes:
        return list(LANGUAGES.values())
    unknown = [c for c in codes if c not in LANGUAGES]
    if unknown:
        raise SystemExit(f"unknown language {unknown[0]!r}; devlab's lessons have "
                         f"{', '.join(LANGUAGES)}")
    return [LANGUAGES[c] for c in codes]


def status(cat: polib.POFile) -> str:
    messages = [e for e in cat if not e.obsolete]
    fuzzy = sum(bool(e.msgstr) and e.fuzzy for e in messages)
    missing = sum(not e.msgstr for e in messages)
    return f"{len(messages) - fuzzy - missing} translated, {fuzzy} stale, {missing} untranslated"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.i18n",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["extract", "update", "build", "check"])
    parser.add_argument("notebooks", nargs="*", help="English notebook names (default: all)")
    parser.add_argument("--lang", action="append", help="only this language (repeatable)")
    parser.add_argument("--draft", action="store_true",
                        help="build: use stale translations and English where none is given")
    args = parser.parse_args(argv)
    notebooks, languages = _chosen(args.notebooks), _languages(args.lang)
    if args.command == "extract":
        for nb in notebooks:
            extract(nb)
            print(f"wrote {template_path(nb).relative_to(ROOT)}")
    elif args.command == "update":
        for nb in notebooks:
            for lang in languages:
                cat = update(nb, lang)
                print(f"{catalog_path(nb, lang.code).relative_to(ROOT)}: {status(cat)}")
    elif args.command == "build":
        failed = []
        for nb in notebooks:
            for lang in languages:
                try:
                    built = build(nb, lang, draft=args.draft)
                except (Incomplete, FileNotFoundError) as e:
                    failed.append(f"{catalog_path(nb, lang.code).relative_to(ROOT)}: {e}")
                    continue
                path = built_path(nb, lang.code)
                path.parent.mkdir(parents=True, exist_ok=True)
                text = nbformat.writes(built) + "\n"
                if not path.exists() or path.read_text(encoding="utf-8") != text:
                    path.write_text(text, encoding="utf-8")
                    print(f"wrote {path.relative_to(ROOT)}")
        if failed:
            print("not built (translate, or build with --draft to preview):\n  "
                  + "\n  ".join(failed), file=sys.stderr)
            return 1
    else:
        problems = check(notebooks if args.notebooks else None, languages)
        for p in problems:
            print(p)
        print(f"{len(problems)} problem(s)" if problems else "translations: all complete and "
              "up to date", file=sys.stderr if problems else sys.stdout)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
