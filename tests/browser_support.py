"""Real JupyterLab in headless Chromium, for the browser test.

`jupyter_lab(root)` starts this venv's JupyterLab on a free localhost port, with a known token
and private settings/workspace directories, and always stops it (its kernels too) with bounded
waits. `launch_chromium(playwright)` starts Debian's Chromium. The page helpers open a notebook,
run it through JupyterLab's own "Run All Cells" command, wait for it and read what it shows.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
]
# Shown by ipywidgets / JupyterLab when a widget or an output cannot be drawn.
RENDER_ERRORS = ("Error displaying widget", "Error rendering", "Failed to load model class",
                 "Could not render")


def chromium_missing_message() -> str:
    return (f"Debian's Chromium is not installed at {CHROMIUM}; the browser test needs it. "
            "Install it with `apt-get install -y chromium` (as root; scripts/test.sh and .ci/run "
            "do this). Do not use `playwright install`.")


# -- the server --------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LabServer:
    url: str  # http://127.0.0.1:PORT/
    token: str
    root: Path
    log: Path
    process: subprocess.Popen[bytes]

    def lab_url(self, notebook: str) -> str:
        return f"{self.url}lab/tree/{notebook}?token={self.token}&reset"

    def api(self, path: str, method: str = "GET", timeout: float = 5.0) -> Any:
        req = urllib.request.Request(
            self.url + path.lstrip("/"), method=method,
            headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"


def _lab_settings(settings_dir: Path) -> None:
    """User settings for a quiet, deterministic JupyterLab: no news toast, no update check,
    and every cell in the DOM (no windowing), so the page shows the whole notebook."""
    settings = {
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
            {"fetchNews": "false", "checkForUpdates": False},
        # Start the notebook's kernel without the "Select Kernel" dialog, which otherwise
        # may pop up after the kernel already shows idle and swallow the next click.
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings":
            {"windowingMode": "none", "autoStartDefaultKernel": True},
    }
    for rel, value in settings.items():
        path = settings_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


@contextmanager
def jupyter_lab(root: Path, *, log: Path, start_timeout: float = 60.0,
                env: dict[str, str] | None = None) -> Iterator[LabServer]:
    """Run `python -m jupyterlab` (this venv's) serving `root`; stop it and its kernels after."""
    port = free_port()
    token = secrets.token_hex(16)
    private = root.parent / f"{root.name}-jupyter"
    for sub in ("config", "runtime", "settings", "workspaces"):
        (private / sub).mkdir(parents=True, exist_ok=True)
    _lab_settings(private / "settings")
    server_env = dict(os.environ)
    server_env.update(
        # Kernels import this checkout's devlab and draw matplotlib inline.
        PYTHONPATH=str(ROOT) + os.pathsep + server_env.get("PYTHONPATH", ""),
        MPLBACKEND="module://matplotlib_inline.backend_inline",
        # Nothing from the user's own Jupyter set-up (settings, workspaces, config).
        JUPYTER_CONFIG_DIR=str(private / "config"),
        JUPYTER_RUNTIME_DIR=str(private / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(private / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(private / "workspaces"),
        PYTHONUNBUFFERED="1",
        # This checkout's JupyterLab extensions (devlab-rtl, the Persian lessons' stylesheet)
        # first: the ones devlab's wheel installs into share/jupyter/labextensions.
        JUPYTER_PATH=os.pathsep.join(
            p for p in (str(ROOT / "share" / "jupyter"), server_env.get("JUPYTER_PATH")) if p),
    )
    server_env.pop("DEVLAB_SIMULATE_GPUS", None)
    if env:
        server_env.update(env)
    cmd = [
        sys.executable, "-m", "jupyterlab",
        "--no-browser", "--ServerApp.open_browser=False",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--ServerApp.shutdown_no_activity_timeout=600",  # an orphaned server ends by itself
        "--MappingKernelManager.shutdown_wait_time=3",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log.parent.mkdir(parents=True, exist_ok=True)
    logfile = log.open("wb")
    proc = subprocess.Popen(cmd, cwd=root, env=server_env, stdin=subprocess.DEVNULL,
                            stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=_die_with_parent)
    server = LabServer(f"http://127.0.0.1:{port}/", token, root, log, proc)
    try:
        _wait_until_up(server, start_timeout)
        yield server
    finally:
        _stop(server)
        logfile.close()


def _die_with_parent() -> None:
    """In the server's process, before exec: get SIGTERM when the test process dies (Linux),
    so a killed test run (timeout, Ctrl-C twice) does not leave a server and kernels behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _wait_until_up(server: LabServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {server.process.returncode} while "
                               f"starting:\n{server.log_tail()}")
        try:
            server.api("api/status", timeout=2)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(0.2)
    raise RuntimeError(f"JupyterLab did not answer within {timeout:.0f} s:\n{server.log_tail()}")


def _stop(server: LabServer) -> None:
    """Ask the server to shut down (it stops its kernels), then make sure: every process it
    started (kernels run in sessions of their own) gets SIGTERM, then SIGKILL."""
    proc = server.process
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        family = []
    if proc.poll() is None:
        try:
            server.api("api/shutdown", method="POST", timeout=5)
        except Exception:  # noqa: BLE001 - fall through to signals
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    alive = [p for p in family if p.is_running()]
    for p in alive:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # the server runs in a session (and process group) of its own
    except (ProcessLookupError, PermissionError):
        pass


# -- the browser -------------------------------------------------------------------------------

def launch_chromium(playwright: Any) -> Any:
    """Debian's Chromium, headless (never a Playwright-downloaded browser)."""
    if not Path(CHROMIUM).exists():
        raise RuntimeError(chromium_missing_message())
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                      headless=True, timeout=30_000)


# In a notebook (JupyterLab's panel, or a page of the rendered site): in its markdown cells,
# text blocks (paragraphs, list items, headings, table cells) whose direction is not right to
# left or which are aligned to the left (JupyterLab's stylesheet sets `text-align: left` on
# every paragraph: a ragged right edge, the last line at the left), code blocks whose direction
# is not left to right, and inline code drawn reversed (its first character right of its last,
# as an unisolated `/GPU:1` or `f(2)` comes out in a right-to-left line); code cells' lines and
# outputs whose direction is not left to right, and code lines that mix right-to-left script
# with Latin letters (a line runs left to right: `# ... GPUها ...` displays out of order).
BIDI_PROBE = """(panel) => {
    const found = {blocks: 0, rtl: 0, notRtl: [], leftAligned: [], cells: 0, pre: 0,
                   preNotLtr: [], code: 0, reversed: [], codeLines: 0, codeNotLtr: 0,
                   mixedLines: []};
    const dir = el => getComputedStyle(el).direction;
    const alignedLeft = el => {
        const a = getComputedStyle(el).textAlign, d = dir(el);
        return a === 'left' || a === '-webkit-left' || (a === 'start' && d === 'ltr') ||
               (a === 'end' && d === 'rtl');
    };
    const rtlScript = /[\u0590-\u08ff\ufb1d-\ufdff\ufe70-\ufefc]/, latin = /[A-Za-z]/;
    const charLeft = (node, i) => {
        const r = document.createRange(); r.setStart(node, i); r.setEnd(node, i + 1);
        return r.getBoundingClientRect().left;
    };
    for (const md of panel.querySelectorAll('.jp-MarkdownCell .jp-RenderedMarkdown')) {
        for (const el of md.querySelectorAll('p, li, h1, h2, h3, h4, td, th')) {
            if (el.closest('pre') || !el.textContent.trim()) continue;
            found.blocks++;
            if (el.matches('td, th')) found.cells++;
            if (dir(el) === 'rtl') found.rtl++;
            else found.notRtl.push(el.textContent.trim().slice(0, 60));
            if (alignedLeft(el)) found.leftAligned.push(el.textContent.trim().slice(0, 60));
        }
        for (const pre of md.querySelectorAll('pre')) {
            found.pre++;
            if (dir(pre) !== 'ltr') found.preNotLtr.push(pre.textContent.slice(0, 60));
        }
        for (const code of md.querySelectorAll('code')) {
            if (code.closest('pre')) continue;
            const text = code.firstChild;
            if (!text || text.nodeType !== 3 || text.length < 2 || code.getClientRects().length !== 1) continue;
            found.code++;
            if (charLeft(text, 0) > charLeft(text, text.length - 1)) found.reversed.push(text.data);
        }
    }
    for (const line of panel.querySelectorAll('.jp-CodeCell .cm-line, .jp-CodeCell pre')) {
        found.codeLines++;
        if (dir(line) !== 'ltr') found.codeNotLtr++;
        for (const text of line.textContent.split('\\n')) {
            if (rtlScript.test(text) && latin.test(text)) found.mixedLines.push(text.trim());
        }
    }
    return found;
}"""


# -- page helpers ------------------------------------------------------------------------------

CODE_PROMPTS = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt"
PROMPT_DONE = re.compile(r"^\[\d+\]:$")


def open_notebook(page: Any, server: LabServer, notebook: str, timeout: float = 60.0) -> None:
    """Open `notebook` in JupyterLab and wait until its kernel is idle."""
    page.goto(server.lab_url(notebook), wait_until="domcontentloaded",
              timeout=int(timeout * 1000))
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(
        state="visible", timeout=int(timeout * 1000))
    wait_kernel_idle(page, timeout)


def dismiss_kernel_dialog(page: Any) -> bool:
    """Accept the "Select Kernel" dialog (its default, Python 3) if it is showing."""
    dialog = page.locator(".jp-Dialog")
    if dialog.count() and "Select Kernel" in (dialog.first.inner_text(timeout=2000) or ""):
        dialog.locator(".jp-Dialog-button.jp-mod-accept").first.click(timeout=5000)
        dialog.first.wait_for(state="detached", timeout=10_000)
        return True
    return False


def wait_kernel_idle(page: Any, timeout: float = 60.0, settle: int = 4) -> None:
    """Wait until the notebook's kernel is idle and no dialog shows, `settle` checks in a row
    (200 ms apart): a kernel dialog can appear after the first "idle"; it is answered."""
    indicator = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) "
                             ".jp-Notebook-ExecutionIndicator")
    dialogs = page.locator(".jp-Dialog")
    deadline = time.monotonic() + timeout
    calm = 0
    while time.monotonic() < deadline:
        dismiss_kernel_dialog(page)
        idle = indicator.count() and indicator.first.get_attribute("data-status") == "idle"
        calm = calm + 1 if idle and not dialogs.count() else 0
        if calm >= settle:
            return
        page.wait_for_timeout(200)
    status = indicator.first.get_attribute("data-status") if indicator.count() else "missing"
    raise AssertionError(f"the kernel did not become idle within {timeout:.0f} s "
                         f"(indicator: {status}, dialogs: {dialogs.all_inner_texts()})")


def run_menu_command(page: Any, menu: str, item: str) -> None:
    """Click a menu bar entry, then one of its items, as a user would ("Run", "Run All Cells").

    The menu bar rather than a keyboard shortcut: headless Chromium does not always give the
    page keyboard focus, and a shortcut that goes nowhere fails silently.
    """
    page.locator(".lm-MenuBar-item", has_text=re.compile(rf"^{re.escape(menu)}$")).first.click(
        timeout=10_000)
    entry = page.locator(".lm-Menu-item:not(.lm-mod-disabled)",
                         has=page.locator(".lm-Menu-itemLabel",
                                          has_text=re.compile(rf"^{re.escape(item)}$")))
    entry.first.click(timeout=10_000)


def run_all_cells(page: Any, started_within: float = 10.0) -> None:
    """Run > Run All Cells, and make sure the cells really started (a prompt leaves "[ ]:");
    if not (a dialog took the click), answer any dialog and try once more."""
    for attempt in (1, 2):
        run_menu_command(page, "Run", "Run All Cells")
        deadline = time.monotonic() + started_within
        while time.monotonic() < deadline:
            dismiss_kernel_dialog(page)
            if any(p != "[ ]:" for p in prompts(page)):
                return
            page.wait_for_timeout(100)
        if attempt == 1:
            page.keyboard.press("Escape")  # close a menu left open
            wait_kernel_idle(page, 20.0)
    raise AssertionError(f"Run All Cells did not start the cells: {prompts(page)}; dialogs: "
                         f"{page.locator('.jp-Dialog').all_inner_texts()}")


def prompts(page: Any) -> list[str]:
    return [p.strip() for p in page.locator(CODE_PROMPTS).all_inner_texts()]


def wait_cells_done(page: Any, timeout: float) -> list[str]:
    """Wait until every code cell shows an execution count ("[3]:"), then for an idle kernel."""
    deadline = time.monotonic() + timeout
    shown: list[str] = []
    while time.monotonic() < deadline:
        shown = prompts(page)
        if shown and all(PROMPT_DONE.match(p) for p in shown):
            wait_kernel_idle(page, max(1.0, deadline - time.monotonic()))
            return shown
        page.wait_for_timeout(200)
    raise AssertionError(f"cells still running or not run after {timeout:.0f} s: {shown}")


def cell(page: Any, index: int) -> Any:
    """The index-th cell (markdown cells count) of the notebook showing."""
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(index)


def output_images(locator: Any, in_widgets: bool = True) -> list[dict[str, Any]]:
    """The PNGs shown in widget views under `locator` (or in any of its outputs): src and
    natural size."""
    where = ".jupyter-widgets img, .widget-output img" if in_widgets else ".jp-OutputArea-output img"
    return locator.locator(where).evaluate_all(
        "imgs => imgs.map(i => ({src: i.getAttribute('src') || '', "
        "width: i.naturalWidth, height: i.naturalHeight, complete: i.complete}))")


def png_ink(src: str) -> float:
    """Fraction of a data: PNG's pixels that are not (near) white: 0 for a blank image."""
    from PIL import Image

    data = base64.b64decode(src.split(",", 1)[1])
    img = Image.open(io.BytesIO(data)).convert("L")
    hist = img.histogram()
    return sum(hist[:240]) / max(1, sum(hist))


def error_texts(page: Any) -> list[str]:
    """Error outputs and render failures anywhere in the notebook showing."""
    nb = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    found = [t for t in RENDER_ERRORS if t in nb.inner_text()]
    stderr = nb.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
    found += [t for t in stderr.all_inner_texts()
              if "Traceback" in t or re.search(r"\b\w*(Error|Exception)\b", t)]
    return found


def screenshot_whole_notebook(page: Any, path: Path, hide_sidebar: bool = True) -> Path:
    """Full-page screenshot showing the whole notebook: JupyterLab's page never scrolls (the
    notebook scrolls inside it), so the window is first made tall enough for every cell."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if hide_sidebar:  # more width for the notebook: collapse the open left panel (file browser)
        tab = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
        if tab.count():
            tab.first.click(timeout=5000)
    # The notebook's scroller (which element it is changes between JupyterLab versions):
    # whichever element in the notebook panel overflows the most.
    needed = page.evaluate(
        """() => {
            const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
            if (!panel) return 0;
            let most = 0;
            for (const el of [panel, ...panel.querySelectorAll('*')]) {
                most = Math.max(most, el.scrollHeight - el.clientHeight);
            }
            return most;
        }""")
    size = page.viewport_size or {"width": 1280, "height": 900}
    if needed and needed > 0:
        page.set_viewport_size({"width": size["width"],
                                "height": min(8000, size["height"] + int(needed) + 40)})
    page.wait_for_timeout(500)  # let JupyterLab lay out again
    page.screenshot(path=str(path), full_page=True)
    return path
