"""The start-up hook (the .pth line and `_devlab_autostart`): a process that never imports torch
pays for one name comparison per import, nothing imported; one that imports torch with
DEVLAB_SIMULATE_GPUS set (at start-up, or by the program itself before) sees the simulated GPUs.

Costs are counted in modules imported, not in time (benchmark: `python -X importtime -c pass`
and whole-process timings, in the reports of issues 16 and 41). pip installs the .pth line
(tests/installed.py); here this checkout's line is run by hand or by site from a sitecustomize,
and programs reach the hook through this environment's own installed line."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from devlab._helpers.host import cpu_cores

ROOT = Path(__file__).resolve().parents[1]

# What the hook imported before issue 16 only to declare types and subclass an ABC: typing
# (~4 ms), importlib.abc (which pulls in importlib.resources, tempfile, shutil, random...).
AVOIDED = ("typing", "importlib.abc", "importlib.resources", "tempfile", "collections.abc")


def _build_backend() -> object:
    """build_backend/devlab_build.py, which holds the .pth line pip installs (PTH_LINE)."""
    spec = importlib.util.spec_from_file_location("devlab_build",
                                                  ROOT / "build_backend" / "devlab_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PTH_LINE = _build_backend().PTH_LINE.strip()


def _python(code: str, isolated: bool = True, **env: str) -> str:
    """Run `code` in a new Python. `isolated`: with -S (no site-packages, so no other .pth
    imports anything first) and the hook's .pth line run by hand, under -X importtime."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEVLAB_")}
    environ["PYTHONPATH"] = str(ROOT)
    environ.update(env)
    args = ["-S", "-X", "importtime", "-c", f"{PTH_LINE}\n{code}"] if isolated else ["-c", code]
    out = subprocess.run([sys.executable, *args], env=environ, capture_output=True, text=True,
                         check=True)
    return out.stdout + out.stderr


def _imported_by_hook(log: str) -> list[str]:
    """Modules imported while `_devlab_autostart` was (importtime nests them above it)."""
    rows = [line.split("|")[-1] for line in log.splitlines() if line.startswith("import time:")]
    names = [r.strip() for r in rows]
    if "_devlab_autostart" not in names:
        return []
    end = names.index("_devlab_autostart")
    depth = len(rows[end]) - len(rows[end].lstrip())
    inner = []
    for row in reversed(rows[:end]):
        if len(row) - len(row.lstrip()) <= depth:
            break
        inner.append(row.strip())
    return inner


def test_the_hook_imports_nothing_before_torch() -> None:
    # The variable set or not: the line's finder is on the path, and nothing is imported
    # (the hook's module neither) until torch is.
    for value in ("2", "", "0", " 0 "):
        log = _python("import sys; print('loaded:', sorted(m for m in sys.modules if m in "
                      f"{AVOIDED!r} or m == '_devlab_autostart'), type(sys.meta_path[0]).__name__)",
                      DEVLAB_SIMULATE_GPUS=value)
        assert "loaded: [] DevlabAutostart" in log, log
        assert _imported_by_hook(log) == [], log


def test_the_finder_is_a_meta_path_finder_without_the_abc() -> None:
    import importlib

    import _devlab_autostart as hook

    finder = hook.AfterTorch(lambda: None)
    assert finder.find_spec("json") is None
    assert repr(finder).startswith("AfterTorch(then=")
    sys.meta_path.insert(0, finder)
    try:
        importlib.invalidate_caches()  # calls every finder's invalidate_caches
    finally:
        sys.meta_path.remove(finder)


# Every way a program reaches torch (issue 41). Each program below ends by reading, in the
# process that imported torch, whether CUDA is there and where a new tensor lives.
REPORT = ("import torch; print('simulated', torch.cuda.is_available(), "
          "torch.ones(1, device='cuda').device, flush=True)")
SIMULATED = "simulated True cuda:0"
# What transformers, datasets and accelerate ask before importing torch (is it installed?).
ASK_FIRST = "import importlib.util; assert importlib.util.find_spec('torch') is not None\n"


def _run(args: list[str], tmp_path: Path, files: dict[str, str] | None = None,
         timeout: float = 240, **env: str) -> str:
    """Run `python *args` in `tmp_path` (holding `files`) with one simulated GPU, through this
    venv's own devlab-autostart.pth; its stdout and stderr."""
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(text)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEVLAB_")}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.pop("PYTHONPATH", str(tmp_path))])
    environ["DEVLAB_SIMULATE_GPUS"] = "1"
    environ.update(env)
    out = subprocess.run([sys.executable, *args], env=environ, cwd=tmp_path, text=True,
                         capture_output=True, timeout=timeout)
    return out.stdout + out.stderr


def _run_each(runs: dict[str, tuple[list[str], dict[str, str], dict[str, str]]],
              tmp_path: Path) -> dict[str, str]:
    """`_run` each of `runs` (name: args, files, environment) side by side, each in a fresh
    Python of its own in a folder of its own: a process imports torch once, so no two import
    orders can share one, but nothing keeps them from running at the same time. As many at once
    as this machine has cores (each holds a few hundred MB while it imports). Their outputs,
    by name."""
    with concurrent.futures.ThreadPoolExecutor(max(2, cpu_cores())) as pool:
        futures = {}
        for name, (args, files, env) in runs.items():
            folder = tmp_path / f"run{len(futures)}"
            folder.mkdir()
            futures[name] = pool.submit(_run, args, folder, files, **env)
        return {name: f.result() for name, f in futures.items()}


def _assert_each(outs: dict[str, str], expected: str | dict[str, str]) -> None:
    """Every run's output holds what it should (`expected`: one text for all, or per name);
    the failure names every run that went wrong."""
    wrong = {name: out for name, out in outs.items()
             if (expected if isinstance(expected, str) else expected[name]) not in out}
    assert not wrong, "\n\n".join(f"--- {name}:\n{out[-3000:]}" for name, out in wrong.items())


# Each program's first import (through this venv's own devlab-autostart.pth, pip's editable
# install of this checkout), then REPORT.
FIRST_IMPORTS = {
    "import torch": ("import torch; print('gpus', torch.cuda.device_count(), torch.ones(1, "
                     "device='cuda:1').device)\n"),
    "find_spec first": ASK_FIRST,
    "import transformers": "import transformers\n",
    "import datasets": "import datasets\n",
    # accelerate imports torch straight away (a plain `import torch` inside its own import),
    # as lightning does (lightning/fabric/fabric.py): lightning, the costliest import of all
    # (~4.5 s of CPU here), would add no other way of reaching torch.
    "import accelerate": "import accelerate\n",
    "importlib.import_module": "import importlib; importlib.import_module('torch')\n",
    "from torch import": "from torch import nn\n",
}
# A library this environment lacks (the compatibility jobs leave the frameworks out) has no
# import order to check.
FIRST_IMPORTS = {name: first for name, first in FIRST_IMPORTS.items()
                 if not name.startswith("import ") or name == "import torch"
                 or importlib.util.find_spec(name.split()[1]) is not None}


def test_the_simulation_starts_whatever_the_program_imports_first(tmp_path: Path) -> None:
    outs = _run_each({name: (["-c", first + REPORT], {}, {"DEVLAB_SIMULATE_GPUS": "2"})
                      for name, first in FIRST_IMPORTS.items()}, tmp_path)
    _assert_each(outs, SIMULATED)
    assert "gpus 2 cuda:1" in outs["import torch"], outs["import torch"]


def test_nvml_asked_before_torch_is_imported(tmp_path: Path) -> None:
    # Hugging Face's memory guide asks NVML before its program imports torch: the simulated
    # GPUs answer there too, whether pynvml is imported by name or `from pynvml import *`.
    ask = ("nvmlInit(); h = nvmlDeviceGetHandleByIndex(0)\n"
           "print('nvml', nvmlDeviceGetCount(), nvmlDeviceGetName(h), "
           "nvmlDeviceGetMemoryInfo(h).total // 2**20, flush=True)\n")
    outs = _run_each({
        "import pynvml": (["-c", "import pynvml\nfrom pynvml import *\n" + ask + REPORT], {},
                          {"DEVLAB_SIMULATE_GPU_MODEL": "T4"}),
        "from pynvml import *": (["-c", "from pynvml import *\n" + ask + REPORT], {},
                                 {"DEVLAB_SIMULATE_GPU_MODEL": "T4"}),
    }, tmp_path)
    _assert_each(outs, "nvml 1 Tesla T4 15360")
    _assert_each(outs, SIMULATED)


def test_a_module_run_with_dash_m_and_a_script_run_through_runpy(tmp_path: Path) -> None:
    files = {"lesson.py": ASK_FIRST + REPORT}
    _assert_each(_run_each({
        "python -m": (["-m", "lesson"], files, {}),
        "runpy": (["-c", "import runpy; runpy.run_path('lesson.py', run_name='__main__')"],
                  files, {}),
    }, tmp_path), SIMULATED)


def test_torch_first_imported_in_a_thread(tmp_path: Path) -> None:
    # Every thread runs routed, not the importing one alone: the main thread, waiting for it,
    # and a thread started before torch's import that uses torch only afterwards.
    program = ("import threading\n"
               "go = threading.Event()\n"
               f"def older():\n    go.wait()\n    {REPORT}\n"
               f"def work():\n    {ASK_FIRST.strip()}\n    {REPORT}\n"
               "o = threading.Thread(target=older)\no.start()\n"
               "t = threading.Thread(target=work)\nt.start()\nt.join()\n"
               f"go.set()\no.join()\n{REPORT}\n")
    out = _run(["-c", program], tmp_path)
    assert out.count(SIMULATED) == 3, out


def test_a_call_arranged_in_running_threads_runs_there_once() -> None:
    # What routes the threads running when torch is first imported in another one: this thread
    # (waiting in join, as the main one does) and a waiting thread run the call at their next
    # Python call;
    # a thread with a profile function of its own (a profiler's) is left alone, and keeps it.
    from devlab._helpers.thread_calls import call_in_threads

    ran: list[tuple[str, bool]] = []
    go = threading.Event()
    kept: list[bool] = []

    def waiting() -> None:
        go.wait(30)

    def profiled() -> None:
        def own(*_: object) -> None:
            return None

        sys.setprofile(own)
        go.wait(30)
        kept.append(sys.getprofile() is own)
        sys.setprofile(None)

    others = [threading.Thread(target=f, name=f.__name__) for f in (waiting, profiled)]
    for t in others:
        t.start()
    # This thread stands for the main one (pytest-xdist may run tests in another thread).
    idents = [threading.get_ident(), *(t.ident for t in others)]
    arranged: list[int] = []

    def arrange() -> None:
        arranged.extend(call_in_threads(idents, lambda ident: lambda: ran.append(
            (threading.current_thread().name, threading.get_ident() == ident))))

    arranger = threading.Thread(target=arrange)
    arranger.start()
    arranger.join()
    go.set()
    for t in others:
        t.join()
    assert sorted(arranged) == sorted(idents[:2])
    assert sorted(ran) == sorted([(threading.current_thread().name, True), ("waiting", True)])
    assert kept == [True] and sys.getprofile() is None


def test_torch_first_imported_in_a_child(tmp_path: Path) -> None:
    # The parent never imports torch: the child, spawned or forked, is the first to.
    def program(method: str) -> str:
        return ("import multiprocessing, sys\n"
                f"def work():\n    {ASK_FIRST.strip()}\n    {REPORT}\n"
                "if __name__ == '__main__':\n"
                f"    p = multiprocessing.get_context({method!r}).Process(target=work)\n"
                "    p.start(); p.join(); assert 'torch' not in sys.modules\n")

    _assert_each(_run_each({method: (["child.py"], {"child.py": program(method)}, {})
                            for method in ("spawn", "fork", "forkserver")}, tmp_path), SIMULATED)


def test_under_torchrun(tmp_path: Path) -> None:
    out = _run(["-m", "torch.distributed.run", "--nproc-per-node", "2", "rank.py"], tmp_path,
               {"rank.py": ASK_FIRST + REPORT}, OMP_NUM_THREADS="1")
    assert out.count(SIMULATED) == 2, out


def test_torch_imported_by_a_sitecustomize_first(tmp_path: Path) -> None:
    # site runs the .pth files before sitecustomize, so the hook is waiting for it.
    out = _run(["-c", "import sys; assert 'torch' in sys.modules\n" + REPORT], tmp_path,
               {"sitecustomize.py": "import torch\n"})
    assert SIMULATED in out, out


def test_an_interrupt_while_devlab_starts_leaves_torch_imported_once(tmp_path: Path) -> None:
    # A stand-in torch that counts its executions; `then` is interrupted, as Ctrl-C during
    # devlab's start-up would be.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "import builtins\nbuiltins.EXECUTED = getattr(builtins, 'EXECUTED', 0) + 1\n")
    program = (
        "import builtins, signal, sys, time\n"
        # A program Ctrl-C reaches: one started in the background by a shell without job
        # control (the compatibility jobs) inherits SIGINT ignored, and interrupt_main() then
        # does nothing, as a real Ctrl-C would not.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import _devlab_autostart as hook\n"
        "def then():\n    raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, hook.AfterTorch(then))\n"
        "try:\n"
        "    import torch\n"
        "    for _ in range(500):\n        time.sleep(0.01)\n"
        "    print('not interrupted')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted, torch imported', 'torch' in sys.modules)\n"
        "import torch\n"
        "print('executed', builtins.EXECUTED)\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEVLAB_")}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(tmp_path)])
    out = subprocess.run([sys.executable, "-S", "-c", program], env=environ, text=True,
                         capture_output=True, timeout=60)
    assert "interrupted, torch imported True\nexecuted 1\n" in out.stdout, out.stdout + out.stderr
    assert "devlab: interrupted while starting the simulated GPUs" in out.stderr, out.stderr


@pytest.mark.parametrize(("visible", "seen"), [
    (None, 4), ("1", 1), ("3,1", 2), ("", 0), ("-1", 0), ("0,4,1", 1), ("2,2", 1), ("0, 1", 2),
    ("GPU-8a1b", 0),
])
def test_cuda_visible_devices_hides_simulated_gpus_as_cuda_reads_it(visible: str | None,
                                                                     seen: int) -> None:
    from devlab.core.config import _cuda_visible

    assert _cuda_visible(4, visible) == seen


def test_cuda_visible_devices_set_inside_the_program_before_torch(tmp_path: Path) -> None:
    program = ("import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '1'\n"
               "import torch\nprint('count', torch.cuda.device_count())\n" + REPORT)
    _assert_each(_run_each({
        "set inside": (["-c", program], {}, {"DEVLAB_SIMULATE_GPUS": "2"}),
        "set empty": (["-c", "import torch; print('available', torch.cuda.is_available())"],
                      {}, {"DEVLAB_SIMULATE_GPUS": "2", "CUDA_VISIBLE_DEVICES": ""}),
    }, tmp_path), {"set inside": "count 1\n" + SIMULATED, "set empty": "available False"})


# The variable set by the program itself (issue 41): this checkout's .pth line, run by site as
# pip's copy is (site.addsitedir runs a folder's .pth files), from a sitecustomize in the run's
# folder; the environment's own line is left with nothing to do (the variable is unset at
# start-up), unless it is this very line already.
SITE_RUNS_THE_LINE = (
    "import site, sys\n"
    "if not any(type(f).__name__ == 'DevlabAutostart' for f in sys.meta_path):\n"
    "    site.addsitedir({folder!r})\n")


def _line_files(tmp_path: Path) -> dict[str, str]:
    """The files that make site run this checkout's .pth line in a run in `tmp_path`."""
    folder = tmp_path / "line"
    folder.mkdir(exist_ok=True)
    (folder / "devlab-autostart.pth").write_text(PTH_LINE + "\n")
    return {"sitecustomize.py": SITE_RUNS_THE_LINE.format(folder=str(folder))}


SET_INSIDE = "import os\nos.environ['DEVLAB_SIMULATE_GPUS'] = '2'\n"


def test_the_variable_set_inside_the_program_before_torch(tmp_path: Path) -> None:
    # A script sets it, a notebook's %env sets it (IPython runs the magic as the cell's first
    # line), a module run with -m sets it, and torch is then reached any way; it is read when
    # torch is imported, with the other settings set there too.
    runs = {
        "script": SET_INSIDE + "import torch\nprint('gpus', torch.cuda.device_count())\n"
                  + REPORT,
        "find_spec first": SET_INSIDE + ASK_FIRST + REPORT,
        "a model set inside": SET_INSIDE + "os.environ['DEVLAB_SIMULATE_GPU_MODEL'] = 'T4'\n"
                              "import torch\nprint(torch.cuda.get_device_name(0))\n" + REPORT,
        "thread": SET_INSIDE + "import threading\n"
                  f"t = threading.Thread(target=lambda: exec({REPORT!r}))\nt.start(); t.join()\n",
        "unset again": SET_INSIDE + "os.environ['DEVLAB_SIMULATE_GPUS'] = '0'\n"
                       "import sys, torch\nprint('simulated', torch.cuda.is_available(), "
                       "'devlab' in sys.modules, '_devlab_autostart' in sys.modules)\n",
    }
    expected = {"script": "gpus 2\n" + SIMULATED, "find_spec first": SIMULATED,
                "a model set inside": "Simulated GPU (modeled T4, CPU-backed)\n" + SIMULATED,
                "thread": SIMULATED, "unset again": "simulated False False False"}
    files = _line_files(tmp_path)
    outs = _run_each({name: (["-c", code], files, {"DEVLAB_SIMULATE_GPUS": ""})
                      for name, code in runs.items()}, tmp_path)
    _assert_each(outs, expected)


def test_the_variable_set_by_a_notebook_magic_before_torch(tmp_path: Path) -> None:
    pytest.importorskip("IPython")
    cell = ("%env DEVLAB_SIMULATE_GPUS=1\n"
            "import torch\nprint('simulated', torch.cuda.is_available(), "
            "torch.ones(1, device='cuda').device, flush=True)\n")
    out = _run(["-m", "IPython", "--no-banner", "--quick", "-c", cell], tmp_path,
               _line_files(tmp_path), DEVLAB_SIMULATE_GPUS="")
    assert SIMULATED in out, out


# Modules torch itself cannot execute twice (their C++ halves register types or libraries
# once): importlib.reload of these fails, or aborts the process, without devlab too.
NOT_RELOADABLE = ("torch", "torch._C", "torch.distributed")


def test_a_reload_of_a_patched_torch_module_keeps_the_simulation(tmp_path: Path) -> None:
    # importlib.reload executes the module afresh in its own namespace (IPython's autoreload
    # too): each of torch's modules the simulation changed is reloaded, and keeps the changes;
    # stop() then leaves each as the reload made it.
    program = (
        "import importlib, sys, types, torch\n"
        "import devlab.engine.simulated as sim\n"
        "final = {}\n"
        "for entry in sim._undo._undo:\n"
        "    if isinstance(entry, tuple) and isinstance(entry[0], types.ModuleType):\n"
        "        final[entry[0].__name__, entry[1]] = entry[3]\n"
        f"names = sorted({{m for m, _ in final if m.startswith('torch') and m not in "
        f"{NOT_RELOADABLE!r}}})\n"
        "assert 'torch.cuda' in names and 'torch.cuda.memory' in names, names\n"
        "for name in names:\n    importlib.reload(sys.modules[name])\n"
        "lost = [k for k, v in final.items() if k[0] in names and "
        "getattr(sys.modules[k[0]], k[1]) is not v]\n"
        "print('reloaded', len(names), 'lost', lost)\n"
        f"{REPORT}\n"
        "x = torch.ones(256, device='cuda:1')\n"
        "print('allocated', torch.cuda.memory_allocated(1), torch.cuda.device_count())\n"
        "sim.stop()\n"
        "print('stopped', torch.cuda.is_available(), torch.cuda.device_count(), "
        "torch.cuda.is_available.__module__)\n")
    out = _run(["-c", program], tmp_path, DEVLAB_SIMULATE_GPUS="2")
    assert "lost []" in out and SIMULATED in out, out
    assert "allocated 1024 2\nstopped False 0 torch.cuda\n" in out, out


def test_settings_set_after_torch_but_before_the_first_cuda_call(tmp_path: Path) -> None:
    # CUDA reads CUDA_VISIBLE_DEVICES when it initializes, not when torch is imported (which
    # is when the hook starts the simulation): set in between, it counts, and so do devlab's
    # own settings; after the first question about the GPUs, nothing changes them.
    after = "import os, torch\n"
    runs = {
        "visible": after + "os.environ['CUDA_VISIBLE_DEVICES'] = '1'\n"
                   "print('count', torch.cuda.device_count())\n" + REPORT,
        "a hidden GPU used first": after + "os.environ['CUDA_VISIBLE_DEVICES'] = '0'\n"
                                   "try:\n    torch.ones(1, device='cuda:1')\n"
                                   "except RuntimeError as e:\n    print(str(e).splitlines()[0])\n"
                                   "print('count', torch.cuda.device_count())\n",
        "none visible": after + "os.environ['CUDA_VISIBLE_DEVICES'] = ''\n"
                        "print('available', torch.cuda.is_available(), torch.cuda.device_count())\n",
        "after the first call": after + "print('count', torch.cuda.device_count())\n"
                                "os.environ['CUDA_VISIBLE_DEVICES'] = '1'\n"
                                "print('count', torch.cuda.device_count())\n",
        "devlab's own list": after + "os.environ['CUDA_VISIBLE_DEVICES'] = '1'\n"
                             "import devlab\nprint('listed', "
                             "len(devlab.config.list_physical_devices('GPU')))\n" + REPORT,
        "a model": after + "os.environ['DEVLAB_SIMULATE_GPU_MODEL'] = 'T4'\n"
                   "print(torch.cuda.get_device_name(1))\n" + REPORT,
    }
    expected = {"visible": "count 1\n" + SIMULATED,
                "a hidden GPU used first": "CUDA error: invalid device ordinal\ncount 1\n",
                "none visible": "available False 0\n",
                "after the first call": "count 2\ncount 2\n",
                "devlab's own list": "listed 1\n" + SIMULATED,
                "a model": "Simulated GPU (modeled T4, CPU-backed)\n" + SIMULATED}
    _assert_each(_run_each({name: (["-c", code], {}, {"DEVLAB_SIMULATE_GPUS": "2"})
                            for name, code in runs.items()}, tmp_path), expected)
