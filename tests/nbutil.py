"""Run notebook cells in a real Jupyter kernel and read their outputs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
IPYWIDGETS7 = ROOT / ".venv" / "ipywidgets7"
IPYWIDGETS7_SPEC = ["ipywidgets==7.7.5", "ipython_genutils==0.2.0"]


def _kernel_env(checkout_on_path: bool = True) -> dict[str, str]:
    env = dict(os.environ)
    # The kernel must import this checkout's devlab, and must not inherit a simulation switch
    # from the test runner's environment unless a test asks for one.
    if checkout_on_path:
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    for name in ("DEVLAB_SIMULATE_GPUS", "DEVLAB_SIMULATE_GPU_MEMORY_MB", "DEVLAB_SIMULATE_GPU_MODEL"):
        env.pop(name, None)
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    return env


def execute(nb: nbformat.NotebookNode, timeout: int = 600, cwd: Path | None = None,
            allow_errors: bool = False, env: dict[str, str] | None = None,
            kernel_name: str = "python3", checkout_on_path: bool = True,
            store_widget_state: bool = True) -> nbformat.NotebookNode:
    """Execute a notebook in a fresh kernel (this venv's python3) and return it with outputs.

    `env` adds to the kernel's environment; `checkout_on_path=False` leaves this checkout off
    its path (a kernel that must import an installed devlab); `store_widget_state` records the
    widgets' final state in the notebook's metadata (nbclient's default, which the widget tests
    read and a page rendered from it needs)."""
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=kernel_name,
        allow_errors=allow_errors,
        store_widget_state=store_widget_state,
        resources={"metadata": {"path": str(cwd or NOTEBOOKS)}},
    )
    kernel_env = _kernel_env(checkout_on_path)
    if env:
        kernel_env.update(env)
    with _patched_environ(kernel_env):
        client.execute()
    return nb


def run_cells(*sources: str, allow_errors: bool = True, **kwargs) -> list[nbformat.NotebookNode]:
    """Execute the given cell sources in one kernel; return the executed cells."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    execute(nb, allow_errors=allow_errors, **kwargs)
    return nb.cells


def run_notebook(name: str, **kwargs) -> nbformat.NotebookNode:
    """Execute notebooks/<name> top to bottom (errors fail the test)."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    return execute(nb, **kwargs)


def text(cell: nbformat.NotebookNode) -> str:
    """All text a cell showed: stream output, text/plain results and error lines."""
    parts: list[str] = []
    stream = None
    for out in cell.get("outputs", []):
        if out.output_type == "stream" and out.name == stream:
            # One stream's consecutive outputs are one text, as a notebook shows them: a busy
            # kernel can send one print in pieces (ipykernel flushes on a timer).
            parts[-1] += out.text
            continue
        stream = out.name if out.output_type == "stream" else None
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.data.get("text/plain", ""))
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
    return "\n".join(parts)


def html(cell: nbformat.NotebookNode) -> str:
    """All HTML a cell displayed."""
    return "\n".join(
        out.data.get("text/html", "")
        for out in cell.get("outputs", [])
        if out.output_type in ("execute_result", "display_data")
    )


def errors(cell: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [out for out in cell.get("outputs", []) if out.output_type == "error"]


def stream(cell: nbformat.NotebookNode, name: str = "stdout") -> str:
    return "".join(o.text for o in cell.get("outputs", []) if o.output_type == "stream" and o.name == name)


class _patched_environ:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __enter__(self) -> None:
        self.saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env)

    def __exit__(self, *exc: object) -> None:
        os.environ.clear()
        os.environ.update(self.saved)


def ensure_ipywidgets7() -> Path:
    """ipywidgets 7.7 (what Colab ships) in its own folder, to put first on a kernel's path.

    Only the Python package is needed in the kernel (widgetsnbextension and
    jupyterlab_widgets 1.x are frontend assets); ipython_genutils is a 7.x import.
    scripts/setup.sh installs it; this installs it if a test runs without that set-up.
    """
    if not (IPYWIDGETS7 / "ipywidgets" / "__init__.py").exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--no-deps", "--target", str(IPYWIDGETS7), *IPYWIDGETS7_SPEC],
            check=True)
    return IPYWIDGETS7


def ipywidgets7_env() -> dict[str, str]:
    """Kernel environment that imports ipywidgets 7.7 instead of the venv's 8."""
    return {"PYTHONPATH": os.pathsep.join([str(ensure_ipywidgets7()), str(ROOT), os.environ.get("PYTHONPATH", "")])}
