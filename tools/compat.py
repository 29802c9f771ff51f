"""The compatibility job: devlab's unit tests and one notebook on one version of torch; or
every lesson in a Colab-like environment.

    bash scripts/compat.sh TORCH_SPEC [CHECKOUT]
    bash scripts/compat.sh 'torch==2.11.*'                  # this repository
    bash scripts/compat.sh torch==2.15.0 /work/snapshot-base
    bash scripts/compat.sh --colab [CHECKOUT]               # the lessons as on Colab

`--colab` builds what Colab's runtime without a GPU has (`COLAB`: Python 3.12, IPython 7.34,
ipykernel 6.17, ipywidgets 7.7, the CUDA build of torch, which runs on the CPU), installs
devlab into it the way the notebooks' set-up cell does (the cell's own code, run with
`google.colab` present, from a copy of CHECKOUT), and runs every notebook in a kernel of it:
the `colab` column of tests/test_lessons.py, driven by this repository's own .venv
(scripts/setup.sh), with `DEVLAB_COLAB_PYTHON` naming the environment's Python. It prints each
notebook's error count and time, and the versions the kernel really had.

Builds a fresh virtual environment `.venv-compat-<spec>` (git-ignored; removed at the end
unless COMPAT_KEEP=1) in this repository with that torch, then devlab's other requirements (torch held at the version installed) and the
test tools. Where PyPI has only a CUDA build of that torch, it is installed without its
dependencies first; if it imports so (it runs on the CPU, which is all devlab needs without
a GPU), its other requirements follow without the several GB of nvidia-* packages, and
otherwise with them. The tests run on a copy of CHECKOUT's files (default: this repository),
so the checkout itself is never written to: the unit tests (`-m "not notebook and not browser
and not binder and not conformance"`, override with COMPAT_MARKERS) and one notebook, the d2l chapter on
simulated GPUs (tests/test_lessons.py). It prints what it cost and found: install
time and size, test counts and times, and each failure's first error line.

Standard library only: it runs before any environment exists.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The conformance corpus is left out with the browser and Binder tests: its frameworks are pinned
# to the versions it is checked with on the suite's torch (see LEFT_OUT).
UNIT_MARKERS = "not notebook and not browser and not binder and not conformance"
NOTEBOOK_TESTS = ["tests/test_lessons.py::test_lesson[05-d2l-gpus-chapter-plain]"]
# pyproject's `test` extra, but what LEFT_OUT names (tests/test_colab_setup.py checks the two
# together: the job stopped at collection once a tool the tests import, polib, was added to the
# extra and not here).
TEST_TOOLS = ["pytest>=7", "hypothesis>=6", "nbclient>=0.9", "nbformat>=5.9", "nbconvert>=7",
              "ipykernel>=6", "setuptools>=70.1", "polib>=1.2", "expecttest>=0.2", "babel>=2.10"]
LEFT_OUT = {
    "pytest-xdist": "the job runs pytest in one process",
    "jupyterlab": "the browser test", "playwright": "the browser test",
    "ruff": "linting is the suite's", "jupyter-repo2docker": "the Binder tests",
    "holistictraceanalysis": "the profiler trace's HTA check (skipped without it; HTA pulls JupyterLab)",
    **dict.fromkeys(["lightning", "accelerate", "torchtitan", "triton", "torchdata", "datasets",
                     "tokenizers", "tyro"], "the conformance corpus"),
    "transformers": "the Hugging Face static-cache tests",
}
# torch's requirements that only a CUDA build has, and that torch imports without.
CUDA_ONLY = re.compile(r"^(nvidia-|triton|cuda-)", re.I)


@dataclass
class Suite:
    name: str
    seconds: float
    counts: dict[str, int]
    failures: list[tuple[str, str]] = field(default_factory=list)  # (test id, first error line)

    def line(self) -> str:
        shown = ", ".join(f"{n} {k}" for k, n in self.counts.items() if n) or "no tests"
        return f"{self.name}: {shown} in {self.seconds:.1f} s"


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, text=True, capture_output=True, **kw)  # type: ignore[call-overload]


def pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args])


def folder_mib(folder: Path) -> float:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total / 2**20


def venv_name(spec: str) -> str:
    return ".venv-compat-" + re.sub(r"[^A-Za-z0-9.]+", "-", spec).strip("-")


def install_torch(python: Path, spec: str) -> dict[str, object]:
    """Install `spec`, without CUDA packages where torch imports without them."""
    start = time.perf_counter()
    done = pip(python, "--no-deps", spec)
    if done.returncode != 0:
        raise SystemExit(f"compat: pip could not install {spec!r}:\n{done.stderr.strip()[-2000:]}")
    meta = json.loads(run([str(python), "-c", _TORCH_META]).stdout)
    rest = [r for r in meta["requires"] if not CUDA_ONLY.match(r)]
    skipped = len(rest) < len(meta["requires"])
    if rest:
        dep = pip(python, *rest, "-c", _pin_file(python.parents[1], f"torch=={meta['version']}"))
        if dep.returncode != 0:
            raise SystemExit(f"compat: torch's requirements failed:\n{dep.stderr[-2000:]}")
    probe = run([str(python), "-c", "import torch; torch.ones(2).sum().item()"])
    how = "without its CUDA packages" if skipped else "as is"
    if probe.returncode != 0 and skipped:
        why = (probe.stderr.strip().splitlines() or ["?"])[-1]
        how = f"with its CUDA packages (without them: {why})"
        full = pip(python, spec)
        if full.returncode != 0:
            raise SystemExit(f"compat: {spec!r} with its dependencies failed:\n{full.stderr[-2000:]}")
    probe = run([str(python), "-c", "import torch; print(torch.__version__, torch.version.cuda)"])
    if probe.returncode != 0:
        raise SystemExit(f"compat: torch does not import:\n{probe.stderr[-2000:]}")
    version, cuda = probe.stdout.split()
    # pip knows a CUDA build as its plain version (2.11.0), torch itself as 2.11.0+cu130.
    return {"version": version, "dist_version": meta["version"],
            "cuda": None if cuda == "None" else cuda, "how": how,
            "seconds": time.perf_counter() - start}


_TORCH_META = """
import json
from importlib.metadata import distribution
d = distribution("torch")
reqs = [r for r in (d.requires or []) if "extra ==" not in r]
print(json.dumps({"version": d.version, "requires": reqs}))
"""


PIN_FILE = "compat-pin.txt"


def _pin_file(venv: Path, line: str) -> str:
    """A constraints file holding torch where it is (kept in the environment's folder)."""
    path = venv / PIN_FILE
    path.write_text(line + "\n")
    return str(path)


def copy_checkout(checkout: Path, into: Path) -> None:
    """The checkout's files as git sees them (tracked and new, not ignored), or all of them
    but virtual environments where it is not a git work tree."""
    listed = run(["git", "-C", str(checkout), "ls-files", "-z", "-co", "--exclude-standard"])
    if listed.returncode == 0:
        for rel in filter(None, listed.stdout.split("\0")):
            src = checkout / rel
            if src.is_file():
                (into / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, into / rel)
    else:
        shutil.copytree(checkout, into, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".venv*", ".git", "site", "test-artifacts"))


def run_pytest(python: Path, cwd: Path, name: str, args: list[str]) -> Suite:
    report = cwd / f"junit-{name}.xml"
    start = time.perf_counter()
    done = subprocess.run([str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           f"--junitxml={report}", *args], cwd=cwd, text=True,
                          capture_output=True, env=_test_env(cwd))
    seconds = time.perf_counter() - start
    if not report.exists():
        tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
        return Suite(name, seconds, {"errors": 1}, [("pytest", " | ".join(tail))])
    return _parse_junit(report, name, seconds)


def _test_env(cwd: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "DEVLAB_SIMULATE_GPUS", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(cwd)
    return env


def _parse_junit(report: Path, name: str, seconds: float) -> Suite:
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures = []
    for case in ET.parse(report).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            counts["failed" if problem.tag == "failure" else "errors"] += 1
            failures.append((test_id, _first_error_line(problem)))
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return Suite(name, seconds, counts, failures)


def _first_error_line(problem: ET.Element) -> str:
    text = (problem.text or "") + "\n" + (problem.get("message") or "")
    for line in text.splitlines():
        if line.startswith("E ") and line[1:].strip():
            return line[1:].strip()[:300]
    return (problem.get("message") or "").strip().splitlines()[0][:300] if problem.get("message") else "?"


def build_and_test(spec: str, checkout: Path, venv: Path, work: Path,
                   begin: float) -> list[Suite] | None:
    """Build the environment, then run the tests on a copy of `checkout`; None if devlab
    cannot be installed beside that torch."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    torch = install_torch(python, spec)
    print(f"  torch {torch['version']} (CUDA {torch['cuda'] or 'none'}) installed {torch['how']} "
          f"in {torch['seconds']:.1f} s", flush=True)
    copy_checkout(checkout, work)
    start = time.perf_counter()
    rest = pip(python, "-e", str(work), *TEST_TOOLS,
               "-c", _pin_file(venv, f"torch=={torch['dist_version']}"))
    if rest.returncode != 0:
        said = [ln for ln in rest.stderr.splitlines() if not ln.startswith("WARNING: Location")]
        print(f"  devlab does not install beside torch {torch['version']}:\n" + "\n".join(said[-15:]))
        return None
    rest_seconds = time.perf_counter() - start
    size = folder_mib(venv)
    torch_size = folder_mib(next(venv.glob("lib/python*/site-packages/torch")))
    print(f"  devlab and test tools installed in {rest_seconds:.1f} s; environment "
          f"{size:.0f} MiB (torch {torch_size:.0f} MiB); built in "
          f"{time.perf_counter() - begin:.1f} s", flush=True)
    markers = os.environ.get("COMPAT_MARKERS", UNIT_MARKERS)
    return [run_pytest(python, work, "unit tests", ["-m", markers]),
            run_pytest(python, work, "notebook", NOTEBOOK_TESTS)]


# What Colab's runtime has (2025): the packages devlab meets there, pinned as Colab pins them.
# Colab ships accelerate with its Hugging Face packages; lesson 06 uses it (the `lab` extra gives
# it to every other place the lessons run), and pytest (googlecolab/backend-info's pip-freeze.txt:
# pytest 7.4 in 2023, 8 since), which lesson 06 runs with devlab's plugin.
COLAB = {"python": "3.12", "torch": "torch==2.11.0",
         "kernel": ["ipython==7.34.0", "ipykernel==6.17.1", "ipywidgets==7.7.1", "matplotlib",
                    "numpy", "accelerate>=1.0,<2", "pytest>=7,<9"]}
# What Colab's kernel has loaded, for the set-up cell here and the kernels of
# tests/lesson_envs.py: google.colab, a module with a spec as an imported one has (accelerate
# asks importlib.util.find_spec("google.colab")).
GOOGLE_COLAB = """
import importlib.machinery, sys, types
colab = types.ModuleType("google.colab")
colab.__spec__ = importlib.machinery.ModuleSpec("google.colab", None)
sys.modules.setdefault("google.colab", colab)
"""
_FAKE_COLAB = GOOGLE_COLAB + """
exec(compile(open(sys.argv[1]).read(), "setup-cell", "exec"), {})
import devlab
print(devlab.__file__)
"""


def find_python(version: str) -> str:
    """A Python `version` ("3.12") that runs: $COMPAT_PYTHON, on PATH, or pyenv's."""
    candidates = [os.environ.get("COMPAT_PYTHON"), shutil.which(f"python{version}"),
                  *sorted(str(p) for p in Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))]
    for candidate in filter(None, candidates):
        if run([candidate, "-c", "import venv"]).returncode == 0:  # a pyenv shim may not run
            return candidate
    raise SystemExit(f"compat --colab: no Python {version} found (set COMPAT_PYTHON)")


def colab(checkout: Path) -> int:
    """The lessons in a Colab-like environment (see the module's docstring)."""
    suite_python = ROOT / ".venv" / "bin" / "python"
    if not suite_python.exists():
        raise SystemExit("compat --colab: run scripts/setup.sh first: its .venv drives the kernels")
    python_exe = find_python(COLAB["python"])
    venv = ROOT / venv_name("colab")
    python = venv / "bin" / "python"
    stamp = venv / "colab-packages.json"
    # COMPAT_REUSE=1 keeps an environment built before with the same Python and torch (torch's
    # CUDA build takes minutes to install), taking devlab out of it; Colab's other packages are
    # installed again (pip leaves those it has as they are).
    def built_with(packages: dict) -> tuple[str, str]:
        return packages["python"], packages["torch"]

    reuse = (os.environ.get("COMPAT_REUSE") == "1" and stamp.exists()
             and built_with(json.loads(stamp.read_text())) == built_with(COLAB))
    if not reuse:
        shutil.rmtree(venv, ignore_errors=True)
    os.environ["PIP_CONSTRAINT"] = os.devnull
    print(f"compat: Colab-like environment {venv.name} (Python {COLAB['python']}, "
          f"{COLAB['torch']}, {', '.join(COLAB['kernel'][:3])}) for {checkout}", flush=True)
    begin = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="devlab-colab-"))
    try:
        if reuse:
            run([str(python), "-m", "pip", "uninstall", "-q", "-y", "devlab"])
            print("  reusing the environment built before (COMPAT_REUSE=1)", flush=True)
            pins = str(venv / PIN_FILE)  # as its build left it, torch where it is
        else:
            subprocess.run([python_exe, "-m", "venv", str(venv)], check=True)
            torch = install_torch(python, COLAB["torch"])
            print(f"  torch {torch['version']} installed {torch['how']} in "
                  f"{torch['seconds']:.1f} s", flush=True)
            pins = _pin_file(venv, f"torch=={torch['dist_version']}")
        kernel = pip(python, *COLAB["kernel"], "-c", pins)
        if kernel.returncode != 0:
            raise SystemExit(f"compat --colab: Colab's packages failed:\n{kernel.stderr[-2000:]}")
        stamp.write_text(json.dumps(COLAB))
        copy_checkout(checkout, work / "checkout")
        cell = work / "cell.py"
        # The checkout's own cell, as tools.links writes it once the repository is public.
        source = run([str(suite_python), "-c", "import sys; from tools import colab_cell; "
                      "print(colab_cell.source(sys.argv[1]))",
                      f"devlab @ file://{work / 'checkout'}"], cwd=str(work / "checkout"))
        if source.returncode != 0:
            raise SystemExit(f"compat --colab: no set-up cell:\n{source.stderr[-2000:]}")
        cell.write_text(source.stdout)
        start = time.perf_counter()
        ran = run([str(python), "-c", _FAKE_COLAB, str(cell)], cwd=str(work))
        if ran.returncode != 0:
            raise SystemExit(f"compat --colab: the set-up cell failed:\n{ran.stderr[-3000:]}")
        print(f"  the set-up cell installed devlab in {time.perf_counter() - start:.1f} s; "
              f"environment {folder_mib(venv):.0f} MiB, built in "
              f"{time.perf_counter() - begin:.1f} s", flush=True)
        env = _test_env(work / "checkout")
        env["DEVLAB_COLAB_PYTHON"] = str(python)
        report = work / "junit-colab.xml"
        start = time.perf_counter()
        subprocess.run([str(suite_python), "-m", "pytest", "-p", "no:cacheprovider", "-q",
                        f"--junitxml={report}", "tests/test_lessons.py", "-k", "colab"],
                       cwd=work / "checkout", env=env, text=True, capture_output=True)
        suite = (_parse_junit(report, "lessons on Colab", time.perf_counter() - start)
                 if report.exists() else Suite("lessons on Colab", 0, {"errors": 1}))
        print("  " + suite.line())
        versions = None
        for found in sorted((work / "checkout" / "test-artifacts" / "lessons").glob("*.colab.json")):
            figures = json.loads(found.read_text())
            versions = figures.pop("versions", None)
            print(f"    {found.name.removesuffix('.colab.json')}: {figures['errors']} errors "
                  f"({figures['intended']} intended), {figures['seconds']} s")
        if versions:
            print("    kernel: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
        for test_id, first in suite.failures:
            print(f"    FAILED {test_id}: {first}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if os.environ.get("COMPAT_KEEP") != "1":
            shutil.rmtree(venv, ignore_errors=True)
    ok = not suite.failures and suite.counts["passed"] > 0
    print(f"compat: --colab: {'PASSED' if ok else 'FAILED'} "
          f"({time.perf_counter() - begin:.0f} s in all)")
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if argv[0] == "--colab":
        checkout = Path(argv[1]).resolve() if len(argv) > 1 else ROOT
        return colab(checkout)
    spec = argv[0]
    checkout = Path(argv[1]).resolve() if len(argv) > 1 else ROOT
    if not (checkout / "pyproject.toml").exists():
        raise SystemExit(f"compat: {checkout} is not a devlab checkout (no pyproject.toml)")
    venv = ROOT / venv_name(spec)
    shutil.rmtree(venv, ignore_errors=True)
    # The job exists to try releases beyond what a machine's pip may cap (this workplace's
    # /etc/xdg/pip caps torch); its own environment goes without a constraints file.
    os.environ["PIP_CONSTRAINT"] = os.devnull
    print(f"compat: {spec} on {checkout}, environment {venv.name}", flush=True)
    begin = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="devlab-compat-"))
    try:
        suites = build_and_test(spec, checkout, venv, work, begin)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if os.environ.get("COMPAT_KEEP") != "1":
            shutil.rmtree(venv, ignore_errors=True)  # several GB with a CUDA build
    if suites is None:
        return 1
    ok = True
    for suite in suites:
        print("  " + suite.line(), flush=True)
        for test_id, first in suite.failures:
            print(f"    FAILED {test_id}: {first}")
        ok = ok and not suite.failures and suite.counts["passed"] > 0
    print(f"compat: {spec}: {'PASSED' if ok else 'FAILED'} "
          f"({time.perf_counter() - begin:.0f} s in all)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
