"""The notebooks' Colab set-up cell, and the Binder and Colab links, all built from pyproject.toml.

Colab cannot be reached from here, so a stand-in plays it: a fresh virtual environment that
already has "Colab's" packages (this project's torch, ipywidgets, matplotlib, ..., linked in,
nvidia-ml-py and cloudpickle left out) but no devlab, with a `google.colab` module present.
The cell must install devlab from a git repository pinned to a commit, add only the
dependencies that are missing, and leave everything else as it was. Off Colab it must do
nothing at all. The lessons themselves run in a Colab-like environment (Python 3.12, IPython
7.34, ipykernel 6.17, ipywidgets 7.7, a CUDA build of torch) in the `colab` column of
tests/test_lessons.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tools import colab_cell, links
from tools.compat import GOOGLE_COLAB

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
OLD_IPYTHON = "7.34.0"


def current_cell_source() -> str:
    home = links.project_home()
    return colab_cell.source(home.install_source if home else None)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebook_opens_with_the_current_setup_cell_and_has_no_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].get("id") == colab_cell.CELL_ID, f"{path.name}: the set-up cell is not first"
    assert code[0].source == current_cell_source(), (
        f"{path.name}: set-up cell out of date; run `python -m tools.links --write`")
    assert [c.get("id") for c in code].count(colab_cell.CELL_ID) == 1
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} keep outputs; notebooks stay output-free in git"


def test_readme_links_block_is_current_and_without_a_repository_there_is_no_link() -> None:
    readme = (ROOT / "README.md").read_text()
    home = links.project_home()
    assert links.readme_block(home) in readme, "README links block out of date: python -m tools.links --write"
    if home is None:
        for dead in ("](https://mybinder.org", "](https://colab.research.google.com",
                     "badge.svg", "badge_logo.svg"):
            assert dead not in readme, f"README links to {dead!r} with no repository set"


def test_links_help_says_what_the_command_does_and_a_wrong_argument_is_refused(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        links.main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: python -m tools.links [-h] [--write]")
    assert "--write" in out and "no links" not in out  # the help, not the links' message
    with pytest.raises(SystemExit) as done:
        links.main(["--wrte"])  # a typo does not print the links as if nothing were asked
    err = capsys.readouterr().err
    assert done.value.code == 2 and "unrecognized arguments: --wrte" in err


def test_links_follow_pyproject(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "devlab"\nversion = "1.2.0"\n'
                         '[project.urls]\nRepository = "https://github.com/someone/devlab.git"\n')
    home = links.project_home(pyproject)
    assert home == links.Home("someone", "devlab", "v1.2.0")
    nb = "01-devices-and-placement.ipynb"
    assert home.binder(nb) == ("https://mybinder.org/v2/gh/someone/devlab/v1.2.0"
                               "?urlpath=lab/tree/notebooks/01-devices-and-placement.ipynb")
    assert home.colab(nb) == ("https://colab.research.google.com/github/someone/devlab/blob/"
                              "v1.2.0/notebooks/01-devices-and-placement.ipynb")
    assert home.install_source == "devlab @ git+https://github.com/someone/devlab@v1.2.0"
    block = links.readme_block(home)
    # Each lesson, and each of its translations (notebooks/<lang>/, tools/i18n.py).
    translated = sum(len(links.translations(p.name)) for p in NOTEBOOKS)
    assert translated == 3 * len(NOTEBOOKS)
    assert block.count("](https://mybinder.org/v2/gh/someone/devlab/v1.2.0?urlpath=") == \
        len(NOTEBOOKS) + translated
    assert "?urlpath=lab/tree/notebooks/fa/01-devices-and-placement.ipynb" in block
    assert "/blob/v1.2.0/notebooks/ja/01-devices-and-placement.ipynb" in block
    assert links.readme_with_block(f"intro\n{links.readme_block(None)}\nrest", home) == f"intro\n{block}\nrest"

    pyproject.write_text('[project]\nname = "devlab"\nversion = "1.2.0"\n')
    assert links.project_home(pyproject) is None
    pyproject.write_text('[project]\nname = "devlab"\nversion = "1"\n'
                         '[project.urls]\nRepository = "https://gitlab.com/someone/devlab"\n')
    with pytest.raises(ValueError, match="github.com/OWNER/REPO"):
        links.project_home(pyproject)


# -- running the cell ---------------------------------------------------------------------------

RECORD_CALLS = """
import json, subprocess, sys
calls = []
subprocess.run = lambda *a, **k: calls.append(a)
before = set(sys.modules)
exec(compile(open(sys.argv[1]).read(), "setup-cell", "exec"), {})
print(json.dumps({"calls": len(calls), "devlab_imported": "devlab" in set(sys.modules) - before}))
"""


def test_off_colab_the_cell_does_nothing(tmp_path: Path) -> None:
    for install in (None, "devlab @ git+https://github.com/someone/devlab@v1.0.0"):
        cell = tmp_path / "cell.py"
        cell.write_text(colab_cell.source(install))
        out = subprocess.run([sys.executable, "-c", RECORD_CALLS, str(cell)], capture_output=True,
                             text=True, check=True, cwd=tmp_path)
        assert json.loads(out.stdout) == {"calls": 0, "devlab_imported": False}
        assert out.stderr == ""


KAGGLE_RECORD = """
import importlib.util, json, subprocess, sys
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name == "devlab" else real(name, *a)
calls = []
subprocess.run = lambda *a, **k: calls.append(a[0])
exec(compile(open(sys.argv[1]).read(), "setup-cell", "exec"), {})
print(json.dumps(calls))
"""


def test_on_kaggle_the_cell_installs_and_without_a_repository_says_so(tmp_path: Path) -> None:
    """Kaggle's notebooks set KAGGLE_KERNEL_RUN_TYPE and, as Colab, ship torch but not devlab
    (the stand-in hides devlab from the cell; pip is recorded, not run)."""
    cell = tmp_path / "cell.py"
    source = "devlab @ git+https://github.com/someone/devlab@v1.0.0"
    kaggle = {**os.environ, "KAGGLE_KERNEL_RUN_TYPE": "Interactive"}
    cell.write_text(colab_cell.source(source))
    elsewhere = {k: v for k, v in os.environ.items() if k != "KAGGLE_KERNEL_RUN_TYPE"}

    def pip_calls(env: dict[str, str]) -> list[list[str]]:
        out = subprocess.run([sys.executable, "-c", KAGGLE_RECORD, str(cell)], capture_output=True,
                             text=True, cwd=tmp_path, env=env, check=True)
        return json.loads(out.stdout)

    on_kaggle = pip_calls(kaggle)
    assert len(on_kaggle) == 1 and source in on_kaggle[0], on_kaggle
    assert pip_calls(elsewhere) == []
    cell.write_text(colab_cell.source(None))
    out = subprocess.run([sys.executable, "-c", KAGGLE_RECORD, str(cell)], capture_output=True,
                         text=True, cwd=tmp_path, env=kaggle)
    assert out.returncode != 0 and "devlab has no public repository yet" in out.stderr

FAKE_COLAB = GOOGLE_COLAB + """
exec(compile(open(sys.argv[1]).read(), "setup-cell", "exec"), {})
import devlab, pynvml, cloudpickle  # devlab.launch and %%distributed pickle with cloudpickle
print(devlab.__file__)
"""


def _git_head() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"not a git checkout ({out.stderr.strip()}): the cell installs from a commit")
    return out.stdout.strip()


def _colab_like_venv(where: Path) -> Path:
    """A new venv whose site-packages links in this project's packages, as Colab has them
    preinstalled, but not devlab, nor nvidia-ml-py and cloudpickle (so the cell must add them),
    and with Colab's IPython, 7.34."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    site = next(where.glob("lib/python*/site-packages"))
    ours = Path(next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()))
    own = {p.name for p in site.iterdir()}
    for entry in ours.iterdir():
        name = entry.name.lower()
        if (entry.name in own or name.endswith(".pth") or name.startswith(("__editable__", "devlab",
                "pynvml", "nvidia_ml_py", "cloudpickle", "pip", "setuptools", "_distutils_hack",
                "__pycache__"))):
            continue
        if name.startswith("ipython-") and name.endswith(".dist-info"):
            _pretend_version(entry, site, OLD_IPYTHON)
            continue
        (site / entry.name).symlink_to(entry)
    return where / "bin" / "python"


def _pretend_version(dist_info: Path, site: Path, version: str) -> None:
    """Record a distribution under another version: the runtime's IPython (Colab long pinned
    7.34) must stay as it is."""
    name = dist_info.name.split("-")[0]
    copy = site / f"{name}-{version}.dist-info"
    shutil.copytree(dist_info, copy)
    meta = copy / "METADATA"
    meta.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}", meta.read_text(), count=1))


def _installed(python: Path) -> dict[str, str]:
    out = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"],
                         capture_output=True, text=True, check=True)
    return {d["name"].lower(): d["version"] for d in json.loads(out.stdout)}


def test_on_colab_the_cell_installs_devlab_pinned_and_keeps_colabs_packages(tmp_path: Path) -> None:
    source = f"devlab @ git+file://localhost{ROOT}@{_git_head()}"  # pip 23 wants a host
    python = _colab_like_venv(tmp_path / "colab")
    before = _installed(python)
    assert "torch" in before and "ipywidgets" in before and "devlab" not in before
    assert "nvidia-ml-py" not in before and "cloudpickle" not in before
    assert before["ipython"] == OLD_IPYTHON
    cell = tmp_path / "cell.py"
    cell.write_text(colab_cell.source(source))

    ran = subprocess.run([str(python), "-c", FAKE_COLAB, str(cell)], capture_output=True,
                         text=True, cwd=tmp_path, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.strip().startswith(str(tmp_path / "colab")), ran.stdout  # devlab from the commit

    after = _installed(python)
    added = {name: v for name, v in after.items() if name not in before}
    assert set(added) == {"devlab", "nvidia-ml-py", "cloudpickle"}, added
    changed = {name for name in before if after.get(name) != before[name]}
    assert not changed, f"the set-up cell changed Colab's packages: {changed}"


def test_pyproject_declares_the_ranges_that_are_tested() -> None:
    """devlab's IPython, ipykernel and ipywidgets ranges hold Colab's versions, which the
    compatibility job's Colab-like environment runs the lessons on, and this suite's own."""
    import ipykernel
    import IPython
    import ipywidgets
    import tomllib
    from packaging.requirements import Requirement

    from tools import compat

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {r.name: r.specifier for r in map(Requirement, [
        *project["dependencies"], *project["optional-dependencies"]["lab"]])}
    colab = dict(pin.split("==") for pin in compat.COLAB["kernel"] if "==" in pin)
    tested = {"ipython": [colab["ipython"], IPython.__version__],
              "ipykernel": [colab["ipykernel"], ipykernel.__version__],
              "ipywidgets": [colab["ipywidgets"], ipywidgets.__version__, "7.7.5"]}
    for name, versions in tested.items():
        for version in versions:
            assert declared[name].contains(version), f"{name} {version} is tested, not declared"
    assert colab["ipython"].startswith("7.34") and colab["ipykernel"].startswith("6.17")
    assert set(colab_cell.small_dependencies()) == {"pynvml", "psutil", "cloudpickle"}


def test_the_compatibility_job_installs_the_test_tools_its_tests_import() -> None:
    """Every requirement of the `test` extra is in the compatibility job's TEST_TOOLS or in its
    LEFT_OUT, with the tests that need it excluded by the job's markers."""
    import tomllib
    from packaging.requirements import Requirement

    from tools import compat

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["test"]
    wanted = {Requirement(r).name for r in extra}
    installed = {Requirement(r).name for r in compat.TEST_TOOLS}
    assert wanted - installed == set(compat.LEFT_OUT), (
        f"in the test extra, not in TEST_TOOLS: {sorted(wanted - installed - set(compat.LEFT_OUT))}; "
        f"LEFT_OUT but not in the extra: {sorted(set(compat.LEFT_OUT) - wanted)}")
    for marker in ("browser", "binder", "conformance"):
        assert f"not {marker}" in compat.UNIT_MARKERS
