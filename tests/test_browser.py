"""A teacher's view: real JupyterLab in headless Chromium runs a `%%memwatch` cell and a
`%%compare_devices` cell, and the charts must actually render."""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from pathlib import Path

import nbformat
import pytest
from browser_support import (
    ARTIFACTS,
    CHROMIUM,
    cell,
    chromium_missing_message,
    error_texts,
    jupyter_lab,
    launch_chromium,
    open_notebook,
    output_images,
    png_ink,
    screenshot_whole_notebook,
    wait_cells_done,
)

pytestmark = pytest.mark.browser

NOTEBOOK = "live-charts.ipynb"
CELLS = [
    "%load_ext devlab",
    "import time\n\nimport torch\n\nimport devlab\n\ndevlab.config.simulate_gpus(1, memory_limit=512)",
    "%%memwatch --device /GPU:0 --interval 50\n"
    "blocks = []\n"
    "for _ in range(8):\n"
    "    blocks.append(torch.ones(4, 1024, 1024, device='cuda:0'))  # 16 MiB each\n"
    "    time.sleep(0.25)",
    '%%compare_devices /CPU:0 /GPU:0 --setup "x = torch.rand(256, 256)"\ny = x @ x',
]


def _write_notebook(root: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / NOTEBOOK)


def _start_kernel(server, path: str) -> None:
    # A session made before the page opens: JupyterLab attaches to it instead of asking
    # which kernel to start (the "Select Kernel" dialog).
    body = json.dumps({"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}})
    req = urllib.request.Request(
        server.url + "api/sessions", data=body.encode(), method="POST",
        headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert json.loads(resp.read())["kernel"]["name"] == "python3"


def _run_all_cells(page) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile("^Run All Cells$")).click()


def test_memwatch_and_compare_devices_charts_render_in_jupyterlab(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(chromium_missing_message())
    from playwright.sync_api import sync_playwright

    root = tmp_path / "notebooks"
    root.mkdir()
    _write_notebook(root)
    shot = ARTIFACTS / "live-charts.png"
    with jupyter_lab(root, log=ARTIFACTS / "jupyterlab.log") as server, sync_playwright() as p:
        _start_kernel(server, NOTEBOOK)
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1900})
            page.set_default_timeout(30_000)
            open_notebook(page, server, NOTEBOOK)
            _run_all_cells(page)
            done = wait_cells_done(page, timeout=90)
            assert len(done) == len(CELLS)
            page.wait_for_timeout(1000)  # the last widget frames reach the page
            screenshot_whole_notebook(page, shot)

            assert error_texts(page) == [], "a widget or an output failed to render"
            memwatch, compare = cell(page, 2), cell(page, 3)
            for name, c in (("%%memwatch", memwatch), ("%%compare_devices", compare)):
                assert c.locator(".jupyter-widgets").count() > 0, f"{name}: no widget view"
                images = [i for i in output_images(c) if i["src"].startswith("data:image/png")]
                assert images, f"{name}: no chart image in its widget"
                chart = max(images, key=lambda i: i["width"] * i["height"])
                assert chart["complete"] and chart["width"] >= 300 and chart["height"] >= 150, chart
                assert png_ink(chart["src"]) > 0.01, f"{name}: the chart is blank"
            summary = memwatch.locator(".jp-Cell-outputArea").inner_text()
            assert re.search(r"GPU:0 \(simulated\)\s+0 B\s+128\.0 MiB\s+\+128\.0 MiB", summary), summary
            assert "20 samples/s" in summary, summary
            table = compare.locator(".jp-Cell-outputArea").inner_text()
            assert "CPU:0" in table and "GPU:0" in table and "speed-up" in table.lower(), table
            assert "say nothing about a real GPU" in table, table
        finally:
            browser.close()
    assert shot.stat().st_size > 20_000


@pytest.fixture(autouse=True, scope="module")
def _fresh_artifacts():
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield
