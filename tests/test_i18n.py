"""The lessons' translations (tools/i18n.py): complete, reviewed since the English last changed,
built into notebooks/<lang>/ from their catalogs, and with exactly the English notebooks' code.

The first tests read the repository as it is; the rest run the tool on a small notebook in a
temporary folder and show that each of those checks fails when it should.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from tools import i18n

ROOT = Path(__file__).resolve().parents[1]
ENGLISH = sorted((ROOT / "notebooks").glob("*.ipynb"))
LANGS = list(i18n.LANGUAGES.values())


# -- the repository's translations ------------------------------------------------------------

@pytest.mark.parametrize("lang", LANGS, ids=lambda lang: lang.code)
@pytest.mark.parametrize("notebook", ENGLISH, ids=lambda p: p.stem)
def test_translation_is_complete_current_and_built(notebook: Path, lang: i18n.Language) -> None:
    problems = i18n.check([notebook], [lang])
    assert not problems, "\n".join(map(str, problems))


def test_no_translation_without_an_english_notebook() -> None:
    problems = [p for p in i18n.check([], LANGS)]
    assert not problems, "\n".join(map(str, problems))


@pytest.mark.parametrize("lang", LANGS, ids=lambda lang: lang.code)
@pytest.mark.parametrize("notebook", ENGLISH, ids=lambda p: p.stem)
def test_translated_code_is_the_english_code(notebook: Path, lang: i18n.Language) -> None:
    """Read straight from the two files, without the tool's build: the same cells, ids,
    metadata and code (tokens, comments aside; magic lines as text), and no outputs."""
    translated = ROOT / "notebooks" / lang.code / notebook.name
    english_nb = nbformat.read(notebook, as_version=4)
    translated_nb = nbformat.read(translated, as_version=4)
    assert not i18n.check_code(english_nb, translated_nb, translated)
    prose = [c for c in translated_nb.cells if c.cell_type == "markdown"]
    assert prose and all(c.source not in {e.source for e in english_nb.cells} for c in prose), (
        f"{translated.name} ({lang.code}) has a markdown cell left in English")


def test_persian_markdown_is_right_to_left() -> None:
    """Every markdown cell of notebooks/fa/ inside `<div dir="rtl">` with blank lines around
    its markdown, and every inline code span in it isolated left to right."""
    for path in sorted((ROOT / "notebooks" / "fa").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "markdown":
                continue
            prose = re.sub(r"^(`{3,}|~{3,}).*?^\1\s*$", "", cell.source, flags=re.M | re.S)
            assert prose.startswith(f"{i18n.RTL_OPEN}\n\n") and prose.rstrip().endswith("\n\n</div>")
            spans = list(i18n.code_spans(prose))
            assert all(prose[:s].endswith(i18n.LTR_OPEN) and prose[e:].startswith(i18n.LTR_CLOSE)
                       for s, e in spans), f"{path.name}: an inline code span is not isolated"


@pytest.mark.parametrize("lang", LANGS, ids=lambda lang: lang.code)
def test_every_language_has_its_translation_guide(lang: i18n.Language) -> None:
    """docs/translation-<lang>.md (terms, register, what stays in English) exists, and every
    catalog of the language names it in its header, where a translator opening it looks."""
    guide = ROOT / "docs" / f"translation-{lang.code}.md"
    assert guide.exists(), f"no translation guide for {lang.english}: {guide}"
    for notebook in ENGLISH:
        header = i18n.load(i18n.catalog_path(notebook, lang.code)).header
        assert f"docs/translation-{lang.code}.md" in header, (notebook.name, header)


# -- the tool, on a notebook of its own -------------------------------------------------------

LESSON = [
    ("markdown", "# A lesson\n\nPut `x` on `/GPU:1`, see [the docs](../docs/gpu-models.md)."),
    ("code", "# Make a tensor on the GPU,\n# then read it back.\nimport torch\n"
             "x = torch.ones(2)  # two ones\n\ndef f():  #@save\n    return x"),
    ("code", "%%device /GPU:1 --log\ny = x * 2  # on the GPU"),
    ("markdown", "## Copies\n\n```python\nz = y.cpu()\n```\n\nA copy is explicit."),
]
JA = {
    "# A lesson\n\nPut `x` on `/GPU:1`, see [the docs](../docs/gpu-models.md).":
        "# レッスン\n\n`x` を `/GPU:1` に置きます。[資料](../docs/gpu-models.md)を参照してください。",
    "Make a tensor on the GPU,\nthen read it back.": "GPU 上にテンソルを作り、読み戻します。",
    "two ones": "1 が 2 つ",
    "on the GPU": "GPU 上で",
    "## Copies\n\n```python\nz = y.cpu()\n```\n\nA copy is explicit.":
        "## コピー\n\n```python\nz = y.cpu()\n```\n\nコピーは明示的です。",
}


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """notebooks/ and i18n/ in a temporary folder, holding one English lesson."""
    monkeypatch.setattr(i18n, "NOTEBOOKS", tmp_path / "notebooks")
    monkeypatch.setattr(i18n, "CATALOGS", tmp_path / "i18n")
    (tmp_path / "notebooks").mkdir()
    write_lesson(tmp_path / "notebooks" / "01-lesson.ipynb", LESSON)
    return tmp_path / "notebooks" / "01-lesson.ipynb"


def write_lesson(path: Path, cells: list[tuple[str, str]]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(s) if k == "markdown" else nbformat.v4.new_code_cell(s)
                for k, s in cells]
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"
    nbformat.write(nb, path)


def translate(path: Path, table: dict[str, str]) -> None:
    cat = i18n.load(path)
    for entry in cat:
        if entry.msgid in table:
            entry.msgstr = table[entry.msgid]
            entry.flags = [f for f in entry.flags if f != "fuzzy"]
            entry.previous_msgid = None
    i18n.save(cat, path)


def ready(notebook: Path, lang: str = "ja") -> Path:
    """The lesson extracted, translated into `lang` and built."""
    i18n.update(notebook, i18n.LANGUAGES[lang])
    translate(i18n.catalog_path(notebook, lang), JA)
    built = i18n.built_path(notebook, lang)
    built.parent.mkdir(parents=True, exist_ok=True)
    built.write_text(nbformat.writes(i18n.build(notebook, i18n.LANGUAGES[lang])) + "\n")
    return built


def problems(notebook: Path, lang: str = "ja") -> list[str]:
    return [p.what for p in i18n.check([notebook], [i18n.LANGUAGES[lang]])]


def test_messages_are_markdown_cells_and_comments(sandbox: Path) -> None:
    units = i18n.units(nbformat.read(sandbox, as_version=4))
    assert [u.text for u in units] == list(JA)  # a comment block is one message; #@save is not one
    assert [u.comment.inline for u in units if u.comment] == [False, True, True]


def test_built_notebook_has_translations_and_the_english_code(sandbox: Path) -> None:
    built = nbformat.read(ready(sandbox), as_version=4)
    assert problems(sandbox) == []
    assert built.cells[1].source == ("# GPU 上にテンソルを作り、読み戻します。\nimport torch\n"
                                     "x = torch.ones(2)  # 1 が 2 つ\n\ndef f():  #@save\n    return x")
    assert built.cells[2].source == "%%device /GPU:1 --log\ny = x * 2  # GPU 上で"
    # One folder deeper than the English notebook: relative links follow.
    assert "[資料](../../docs/gpu-models.md)" in built.cells[0].source
    assert built.metadata["devlab_i18n"]["language"] == "ja"


def test_an_english_change_marks_its_translation_stale(sandbox: Path) -> None:
    ready(sandbox)
    changed = [(k, s.replace("A copy is explicit.", "A copy is always explicit.")) for k, s in LESSON]
    write_lesson(sandbox, changed)
    found = problems(sandbox)
    assert any("not updated to the English notebook" in p for p in found), found
    i18n.update(sandbox, i18n.LANGUAGES["ja"])
    cat = i18n.load(i18n.catalog_path(sandbox, "ja"))
    entry = cat.find(changed[3][1])
    # gettext's way: the old translation kept, flagged fuzzy, the old English beside it.
    assert entry.fuzzy and entry.msgstr == JA[LESSON[3][1]]
    assert entry.previous_msgid == LESSON[3][1]
    assert '#| msgid ""\n#| "## Copies\\n"' in i18n.catalog_path(sandbox, "ja").read_text()
    found = problems(sandbox)
    assert any(p.startswith("stale (fuzzy): the English markdown cell 4") for p in found), found
    with pytest.raises(i18n.Incomplete, match="stale"):
        i18n.build(sandbox, i18n.LANGUAGES["ja"])
    assert "コピーは明示的です" in i18n.build(sandbox, i18n.LANGUAGES["ja"], draft=True).cells[3].source
    # Reviewed: the flag removed (the text may stay), built again: nothing left to do.
    translate(i18n.catalog_path(sandbox, "ja"), {changed[3][1]: JA[LESSON[3][1]]})
    i18n.built_path(sandbox, "ja").write_text(
        nbformat.writes(i18n.build(sandbox, i18n.LANGUAGES["ja"])) + "\n")
    assert problems(sandbox) == []


def test_a_stale_translation_keeps_the_english_it_was_made_from(sandbox: Path) -> None:
    """Changed twice before review: still fuzzy, its `#| msgid` still the English the
    translation was made from (Babel's merge alone would keep only the last), and the
    translator's own comment kept."""
    ready(sandbox)
    path = i18n.catalog_path(sandbox, "ja")
    cat = i18n.load(path)
    cat.find(LESSON[3][1]).tcomment = "checked against the guide"
    i18n.save(cat, path)
    once = [(k, s.replace("A copy is explicit.", "A copy is always explicit.")) for k, s in LESSON]
    twice = [(k, s.replace("A copy is explicit.", "A copy is always explicit, too."))
             for k, s in LESSON]
    for cells in (once, twice):
        write_lesson(sandbox, cells)
        i18n.update(sandbox, i18n.LANGUAGES["ja"])
    entry = i18n.load(path).find(twice[3][1])
    assert entry.fuzzy and entry.msgstr == JA[LESSON[3][1]]
    assert entry.previous_msgid == LESSON[3][1]
    assert entry.tcomment == "checked against the guide"
    # Text unlike any translated one (difflib's ratio under 0.6) starts untranslated.
    write_lesson(sandbox, [*twice[:3], ("markdown", "Nothing in common with the rest.")])
    i18n.update(sandbox, i18n.LANGUAGES["ja"])
    assert i18n.load(path).find("Nothing in common with the rest.").msgstr == ""


def test_new_english_text_is_untranslated(sandbox: Path) -> None:
    ready(sandbox)
    write_lesson(sandbox, [*LESSON, ("markdown", "Something entirely new to say here.")])
    i18n.update(sandbox, i18n.LANGUAGES["ja"])
    found = problems(sandbox)
    assert any(p.startswith("untranslated: the markdown cell 5") for p in found), found


def test_a_changed_comment_is_stale_too(sandbox: Path) -> None:
    ready(sandbox)
    write_lesson(sandbox, [(k, s.replace("# two ones", "# two ones each")) for k, s in LESSON])
    i18n.update(sandbox, i18n.LANGUAGES["ja"])
    assert any(p.startswith("stale (fuzzy): the English inline comment in code cell 2")
               for p in problems(sandbox))


def test_an_english_code_change_leaves_the_built_notebook_out_of_date(sandbox: Path) -> None:
    ready(sandbox)
    write_lesson(sandbox, [(k, s.replace("torch.ones(2)", "torch.ones(3)")) for k, s in LESSON])
    found = problems(sandbox)
    assert any("the code differs from the English" in p for p in found), found
    assert any("out of date with its catalog" in p for p in found), found


def test_translated_code_is_compared_without_comments(sandbox: Path) -> None:
    built = ready(sandbox)
    english = nbformat.read(sandbox, as_version=4)

    def edited(old: str, new: str) -> list[str]:
        nb = nbformat.read(built, as_version=4)
        nb.cells[1].source = nb.cells[1].source.replace(old, new)
        nb.cells[2].source = nb.cells[2].source.replace(old, new)
        return [p.what for p in i18n.check_code(english, nb, built)]

    # Comments (and how many lines a block takes) are the translation's own.
    assert edited("# GPU 上にテンソルを作り、読み戻します。", "# 一行目\n# 二行目\n\n# 三行目") == []
    assert edited("  # 1 が 2 つ", "") == []
    # Code, strings, device names and magic lines are not.
    assert edited("torch.ones(2)", "torch.ones(2.0)")
    assert edited("return x", "return  x") == []  # the same tokens
    assert edited("%%device /GPU:1 --log", "%%device /GPU:0 --log")
    nb = nbformat.read(built, as_version=4)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="hi")]
    assert any("has outputs" in p.what for p in i18n.check_code(english, nb, built))


def test_a_translation_keeps_the_english_code_spans_and_links(sandbox: Path) -> None:
    ready(sandbox)
    first = LESSON[0][1]
    translate(i18n.catalog_path(sandbox, "ja"), {first: "# レッスン\n\n`x` を `/GPU:0` に置きます。"})
    found = problems(sandbox)
    assert any("inline code differs from the English: missing ['/GPU:1'], added ['/GPU:0']" in p
               for p in found), found
    assert any("lost the English links ['../docs/gpu-models.md']" in p for p in found), found


def test_update_touches_nothing_when_nothing_changed(sandbox: Path) -> None:
    ready(sandbox)
    files = sorted(i18n.CATALOGS.rglob("*.po*"))
    before = [f.read_bytes() for f in files]
    i18n.update(sandbox, i18n.LANGUAGES["ja"])
    assert [f.read_bytes() for f in files] == before


def test_other_lessons_lend_their_reviewed_translations(sandbox: Path) -> None:
    ready(sandbox)
    second = sandbox.with_name("02-more.ipynb")
    write_lesson(second, [LESSON[1]])
    cat = i18n.update(second, i18n.LANGUAGES["ja"])
    reused = cat.find("Make a tensor on the GPU,\nthen read it back.")
    assert reused.msgstr == JA[reused.msgid] and reused.fuzzy  # to be checked in its new place


def test_leftover_translations_are_reported(sandbox: Path) -> None:
    ready(sandbox)
    shutil.copy(i18n.built_path(sandbox, "ja"), i18n.NOTEBOOKS / "ja" / "09-gone.ipynb")
    found = [p.what for p in i18n.check([sandbox], [i18n.LANGUAGES["ja"]])]
    assert any("no English notebook of this name" in p for p in found), found


def test_persian_build_is_right_to_left(sandbox: Path) -> None:
    i18n.update(sandbox, i18n.LANGUAGES["fa"])
    translate(i18n.catalog_path(sandbox, "fa"), {
        LESSON[0][1]: "# یک درس\n\n`x` را روی `/GPU:1` بگذارید؛ [مستندات](../docs/gpu-models.md) را ببینید.",
        LESSON[3][1]: "## کپی‌ها\n\n```python\nz = y.cpu()\n```\n\nکپی همیشه صریح است."})
    nb = i18n.build(sandbox, i18n.LANGUAGES["fa"])
    # Code comments stay English (update wrote them so): a code line runs left to right.
    assert nb.cells[1].source == LESSON[1][1] and nb.cells[2].source == LESSON[2][1]
    assert nb.cells[0].source == (
        '<div dir="rtl" style="text-align: right">\n\n# یک درس\n\n<span dir="ltr">`x`</span> را روی '
        '<span dir="ltr">`/GPU:1`</span> بگذارید؛ [مستندات](../../docs/gpu-models.md) را ببینید.'
        "\n\n</div>")
    # The code block stays outside, left to right, between two right-to-left parts.
    rtl = '<div dir="rtl" style="text-align: right">'
    assert nb.cells[3].source == (f"{rtl}\n\n## کپی‌ها\n\n</div>\n\n```python\nz = y.cpu()\n"
                                  f"```\n\n{rtl}\n\nکپی همیشه صریح است.\n\n</div>")
    json.dumps(nb)  # plain JSON, as nbformat writes it


def test_persian_code_comments_stay_english(sandbox: Path) -> None:
    """A Persian comment in a code line displays out of order (`GPUها` torn apart, the
    sentence's end at its start): the Persian catalog's comments are the English text, filled in
    by update, and check refuses any other."""
    cat = i18n.update(sandbox, i18n.LANGUAGES["fa"])
    comments = [e for e in cat if e.msgid in list(JA)[1:4]]
    assert comments and all(e.msgstr == e.msgid and not e.fuzzy for e in comments)
    translate(i18n.catalog_path(sandbox, "fa"), {"two ones": "دو تا یک"})
    found = problems(sandbox, "fa")
    assert any(p.startswith("the inline comment in code cell 2 (id cell-1), line 4: a code "
                            "comment in Persian stays in English") for p in found), found
    # A translator's edit is undone by the next update, not kept.
    assert i18n.update(sandbox, i18n.LANGUAGES["fa"]).find("two ones").msgstr == "two ones"


@pytest.mark.parametrize(("text", "spans"), [
    ("a `b` c", ["`b`"]),
    ("``a ` b`` and `c`", ["``a ` b``", "`c`"]),
    ("no `closing here", []),
    (r"escaped \`not code\` and `code`", ["`code`"]),
    ("```x``` then `y`", ["```x```", "`y`"]),
])
def test_code_spans_as_commonmark_reads_them(text: str, spans: list[str]) -> None:
    assert [text[s:e] for s, e in i18n.code_spans(text)] == spans


def test_cli_check_exit_status(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ready(sandbox)
    for lang in ("ko", "fa"):
        i18n.update(sandbox, i18n.LANGUAGES[lang])
    assert i18n.main(["check", "--lang", "ja"]) == 0
    assert i18n.main(["check"]) == 1
    out = capsys.readouterr().out
    assert "untranslated" in out and "ko.po" in out


def test_a_translation_keeps_the_english_structure(sandbox: Path) -> None:
    """Headings and list items as in the English, and no emphasis that fails to parse: beside
    CJK punctuation CommonMark's flanking rules can leave `**` showing as text."""
    ready(sandbox)
    last = LESSON[3][1]
    translate(i18n.catalog_path(sandbox, "ja"), {
        last: "コピー\n\n```python\nz = y.cpu()\n```\n\nこれは**「明示的」**です。\n\n- 一つ"})
    found = problems(sandbox)
    assert any("headings (levels []) are not the English ones ([2])" in p for p in found), found
    assert any("1 list items, the English 0" in p for p in found), found
    assert any("an emphasis did not parse, `*` shows as text: 'これは**「明示的」**です。'" in p
               for p in found), found


def test_a_rendered_translation_shows_the_english_runs_outputs_only_for_the_same_code() -> None:
    """tools/render.py runs each lesson once, in English, and gives each translation's page the
    outputs of the English cell of the same id; a translation whose code differs is refused."""
    from tools import render

    english = nbformat.read(ROOT / "notebooks" / "05-d2l-gpus-chapter.ipynb", as_version=4)
    translation = nbformat.read(ROOT / "notebooks" / "fa" / "05-d2l-gpus-chapter.ipynb", as_version=4)
    ran = english  # stands for the executed English notebook: outputs told apart by cell id
    for n, cell in enumerate(c for c in ran.cells if c.cell_type == "code"):
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"ran {cell.id}\n")]
        cell.execution_count = n + 1
    ran.metadata["widgets"] = {"state": "of the English run"}

    page = render.as_translated(ran, translation)
    assert [c.source for c in page.cells] == [c.source for c in translation.cells]
    code = [c for c in page.cells if c.cell_type == "code"]
    assert code and all(c.outputs[0]["text"] == f"ran {c.id}\n" for c in code)
    assert page.metadata["widgets"] == {"state": "of the English run"}
    assert not any(c.get("outputs") for c in translation.cells), "the translation is not changed"

    translation.cells[page.cells.index(code[-1])].source += "\nx = 1"
    with pytest.raises(ValueError, match="code differs"):
        render.as_translated(ran, translation)
