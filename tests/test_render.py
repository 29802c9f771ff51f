"""The rendered lessons (scripts/render.sh): every notebook, in English and in each translation,
executed (the run of tests/test_lessons.py's `plain` column, `lesson_envs.plain_run`) and
written to site/ as a static page, widgets drawn as their final state, a switch
between the languages on every page; pages checked in headless Chromium (one in English, the
Persian ones right to left)."""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from browser_support import BIDI_PROBE, CHROMIUM, chromium_missing_message, launch_chromium
from lesson_envs import plain_run, shared_dir
from nbutil import errors

from tools import render
from tools.i18n import LANGUAGES

# One worker runs this module: its tests share one expensive module fixture, which
# each worker would otherwise build again.
pytestmark = [pytest.mark.notebook, pytest.mark.browser, pytest.mark.xdist_group("test_render")]

ROOT = Path(__file__).resolve().parents[1]
NAMES = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
# Every page: each lesson in English and in each language it is translated into.
PAGES = [(name, lang) for name in NAMES for lang in render.languages_of(name)]
SHOTS = ROOT / "test-artifacts" / "site"
PNG = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=\s]+)"')
# Cells whose output is a chart: these must show at least one image on the page.
CHART_CELL = re.compile(r"^%%memwatch|^%%compare_devices|\.plot\(\)\s*$", re.M)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Path, nbformat.NotebookNode]]:
    shared = shared_dir(tmp_path_factory.getbasetemp())

    def run_english(path: Path) -> nbformat.NotebookNode:
        """The lesson's run in tests/test_lessons.py's `plain` column (render.execute's
        kernel environment: this checkout's devlab, no simulation switch, inline matplotlib),
        refused as render.execute refuses it where a cell not tagged raises-exception failed."""
        nb = plain_run(path, shared).nb
        failed = [c.source.splitlines()[0] for c in nb.cells if c.cell_type == "code" and errors(c)
                  and "raises-exception" not in c.metadata.get("tags", [])]
        assert not failed, f"{path.name}: cells failed: {failed}"
        return nb

    yield render.render(NAMES, render.SITE, run_english=run_english)


def ink(png_base64: str) -> float:
    """Fraction of the image's pixels that are not (near) white: 0 for a blank image."""
    from PIL import Image

    img = Image.open(io.BytesIO(base64.b64decode(png_base64))).convert("L")
    hist = img.histogram()
    return sum(hist[:240]) / max(1, sum(hist))


def cell_html(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("data", {}).get("text/html", "") + (
        f'src="data:image/png;base64,{o["data"]["image/png"]}"' if "image/png" in o.get("data", {}) else "")
        for o in cell.get("outputs", []))


@pytest.mark.parametrize(("name", "lang"), PAGES, ids=lambda v: getattr(v, "code", v))
def test_page_is_static_with_every_output_and_chart(site, name: str, lang: render.Language) -> None:
    page_path = render.page_path(render.SITE, name, lang)
    nb = site[page_path]
    page = page_path.read_text()
    for leftover in ("Loading widget", render.WIDGET_VIEW, render.WIDGET_STATE, "<script",
                     "Error displaying widget"):
        assert leftover not in page, f"{page_path.name} still has {leftover!r}"
    assert f'<html lang="{lang.code}">' in page
    source = nbformat.read(render.source(name, lang), as_version=4)
    code = [c for c in source.cells if c.cell_type == "code"]
    assert page.count("jp-CodeCell") >= len(code), "a code cell is missing from the page"
    for cell in nb.cells:
        if cell.cell_type == "code" and CHART_CELL.search(cell.source):
            assert PNG.search(cell_html(cell)), f"{name}: no chart under\n{cell.source}"
    blank = [i for i, data in enumerate(PNG.findall(page)) if ink(data) < 0.01]
    assert not blank, f"{page_path.name}: images {blank} are blank"


def test_widgets_are_drawn_as_their_final_state(site) -> None:
    page = (render.SITE / "03-d2l-exercises.html").read_text()
    # the exercises' progress bars: static in the kernel's own output once finished (the page
    # writes their attributes in its own order and quotes)
    tags = re.findall(r"<progress\b[^>]*>", page)
    bars = [(re.search(r"""value=["'](\d+)""", t)[1], re.search(r"""max=["'](\d+)""", t)[1])
            for t in tags]
    assert bars, "03: no progress bar on the page"
    assert all(value == top for value, top in bars), f"03: a progress bar is not full: {bars}"
    # devlab's own finished widgets left their final state as static output in the kernel
    # already (charts, status lines): nothing to freeze.
    memory = (render.SITE / "02-memory.html").read_text()
    assert memory.count("devlab-memory-monitor") >= 2 and "memory (stopped" in memory


def test_index_lists_every_lesson_in_every_language(site) -> None:
    index = (render.SITE / "index.html").read_text()
    assert [render.page_path(Path("."), n, lang).as_posix() for n, lang in PAGES] == \
        re.findall(r'href="([^"]+)"', index)
    assert {lang for _, lang in PAGES} == {render.ENGLISH, *LANGUAGES.values()}


@pytest.mark.parametrize(("name", "lang"), PAGES, ids=lambda v: getattr(v, "code", v))
def test_every_page_switches_between_the_languages(site, name: str, lang: render.Language) -> None:
    """At the top of each page: the same lesson in each language, named in that language,
    the page's own marked as current; every link leads to a page of the site."""
    page_path = render.page_path(render.SITE, name, lang)
    nav = re.search(r'<nav [^>]*class="devlab-languages"[^>]*>(.*?)</nav>', page_path.read_text(), re.S)
    assert nav, f"{page_path}: no language switch"
    links = re.findall(r'<a ([^>]*)>([^<]*)</a>', nav[1])
    targets = {label: re.search(r'href="([^"]+)"', attrs)[1] for attrs, label in links}
    assert list(targets) == ["devlab lessons", *(other.name for other in render.languages_of(name))]
    for label, target in targets.items():
        assert (page_path.parent / target).resolve().exists(), f"{page_path}: {label} -> {target}"
    current = [label for attrs, label in links if 'aria-current="page"' in attrs]
    assert current == [lang.name]
    for other in render.languages_of(name):
        assert (page_path.parent / targets[other.name]).resolve() == \
            render.page_path(render.SITE, name, other).resolve()


def test_a_page_in_headless_chromium(site) -> None:
    """What a teacher sees: the memory lesson, read offline in a browser."""
    if not Path(CHROMIUM).exists():
        pytest.fail(chromium_missing_message(), pytrace=False)
    from playwright.sync_api import sync_playwright

    page_path = render.SITE / "02-memory.html"
    shot = SHOTS / "02-memory.png"
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_path.as_uri(), wait_until="load")
            images = page.evaluate("() => Array.from(document.images).map(i => "
                                   "[i.complete, i.naturalWidth, i.naturalHeight])")
            text = page.inner_text("body")
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert len(images) >= 2 and all(ok and w >= 300 and h >= 150 for ok, w, h in images), images
    assert "Loading widget" not in text
    assert "still held" in text and "OutOfMemoryError" in text
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == [], "the page fetched from elsewhere"
    assert shot.stat().st_size > 50_000, f"screenshot looks empty: {shot}"


@pytest.mark.parametrize("name", [n for n, lang in PAGES if lang.rtl])
def test_persian_page_reads_right_to_left_in_chromium(site, name: str) -> None:
    """A Persian page as a reader sees it: prose right to left and aligned to the right (the
    page carries devlab's right-to-left stylesheet); code cells, outputs, code blocks and every
    inline code span left to right, and no code line mixing Persian with Latin. Screenshot in
    test-artifacts/site/."""
    if not Path(CHROMIUM).exists():
        pytest.fail(chromium_missing_message(), pytrace=False)
    from playwright.sync_api import sync_playwright

    page_path = render.page_path(render.SITE, name, LANGUAGES["fa"])
    shot = SHOTS / f"fa-{Path(name).stem}.png"
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(page_path.as_uri(), wait_until="load")
            found = page.locator("body").evaluate(BIDI_PROBE)
            switch = page.locator("nav.devlab-languages").inner_text()
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert found["blocks"] > 0 and found["notRtl"] == [], found
    assert found["leftAligned"] == [], found
    assert found["preNotLtr"] == [] and found["codeNotLtr"] == 0, found
    assert found["codeLines"] > 0 and found["mixedLines"] == [], found
    assert found["code"] > 0 and found["reversed"] == [], found
    assert "English" in switch and "فارسی" in switch
    assert shot.stat().st_size > 50_000, f"screenshot looks empty: {shot}"


def test_the_index_reads_persian_right_to_left(site) -> None:
    """The index's Persian column: each title laid out right to left («GPUها — ...» whole, its
    quotes on their own sides, the lesson's number at the right) and aligned to the right; the
    other columns left to right. Screenshot: test-artifacts/site/index.png."""
    if not Path(CHROMIUM).exists():
        pytest.fail(chromium_missing_message(), pytrace=False)
    from playwright.sync_api import sync_playwright

    shot = SHOTS / "index.png"
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 500})
            page.goto((render.SITE / "index.html").as_uri(), wait_until="load")
            cells = page.evaluate("""() => [...document.querySelectorAll('td[lang], th[lang]')]
                .map(c => {
                    const s = getComputedStyle(c), a = c.querySelector('a') || c;
                    const box = c.getBoundingClientRect(), text = a.getBoundingClientRect();
                    return {lang: c.lang, dir: s.direction, align: s.textAlign,
                            gapLeft: text.left - box.left, gapRight: box.right - text.right,
                            text: c.textContent.slice(0, 40)};
                })""")
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    persian = [c for c in cells if c["lang"] == "fa"]
    assert len(persian) == len(NAMES) + 1, cells
    assert all(c["dir"] == "rtl" and c["align"] in ("start", "right") for c in persian), persian
    # Aligned to the right: the title ends at the cell's right edge, whatever space is left.
    assert all(c["gapRight"] <= c["gapLeft"] + 1 for c in persian), persian
    assert all(c["dir"] == "ltr" for c in cells if c["lang"] != "fa"), cells
    assert shot.stat().st_size > 10_000, f"screenshot looks empty: {shot}"
