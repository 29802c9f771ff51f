"""devlab's start-up hook: with DEVLAB_SIMULATE_GPUS=N set when torch is imported, every Python
process sees N simulated GPUs, without importing devlab. (pynvml imported first, with the
variable set, starts them too, once its module has run: `_nvml_finder`.)

pip installs `devlab-autostart.pth` into site-packages with devlab (regular and editable
installs); Python runs its one line at start-up (`build_backend/devlab_build.py`'s PTH_LINE),
which puts a finder first on `sys.meta_path` that compares each imported name with "torch" and
does nothing else until torch's import. There it reads the variable, so a program that sets it
itself before `import torch` (`os.environ["DEVLAB_SIMULATE_GPUS"] = "2"` in a script, `%env` in
a notebook) is simulated too, and only with the variable set does it import this module
(`found`), which imports nothing itself (`os` and `sys` are loaded at start-up already; its type
hints are never evaluated): it waits for torch's module to be executed, however the program
reaches it (Note [Every spec for torch]), then imports devlab, which starts the simulation
(`devlab.config.simulate_from_environment`) in every thread of the process, whichever imported
torch (`devlab.simulated.route_running_threads`). So a script written for real GPUs, and every
process it starts (torch.multiprocessing.spawn, multiprocessing with spawn, fork or forkserver,
torchrun's workers, DataLoader workers), sees the simulated GPUs: the way coverage.py measures
subprocesses. A process that never imports torch, or imports it without the variable, imports
nothing at all (`python -X importtime`).

site runs the .pth lines before `sitecustomize`, so a sitecustomize that imports torch finds
the hook waiting; where torch was imported before the hook (a user-site .pth, an embedder
that imports it before site runs), the line imports this module and `install` starts the
simulation at once. What no hook can see is a process whose site never ran the line
(`python -S`, an embedder without site) or one that sets the variable only after torch was
imported: no devlab code runs there until `import devlab`, which starts the GPUs.
(A .pth line of devlab before issue 41's imported this module at start-up when the variable
was set then; the module still installs itself when imported so.)
"""

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms at start-up)
if TYPE_CHECKING:
    from collections.abc import Callable
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

VARIABLE = "DEVLAB_SIMULATE_GPUS"


def _start() -> None:
    try:
        import devlab  # noqa: F401 - importing devlab starts the simulation from the variable
    except Exception as e:  # the program runs on without simulated GPUs, and is told why
        print(f"devlab: {VARIABLE} is set, but devlab could not start its simulated GPUs: "
              f"{type(e).__name__}: {e}", file=sys.stderr)


class AfterTorch:
    """A `sys.meta_path` finder (`importlib.abc.MetaPathFinder`'s protocol, without importing
    it) that finds nothing itself: it wraps the loader of every spec found for `torch`, so that
    `then()` runs, once, as soon as torch's module has been executed, and then leaves
    `sys.meta_path`. (The conformance corpus's observer of rank processes uses one too.)

    Note [Every spec for torch]: a program reaches torch by more than `import torch`.
    `importlib.util.find_spec("torch")` (transformers', datasets' and accelerate's checks for
    what is installed) asks the finders for a spec, which the caller throws away: the real
    import later asks again and gets a fresh spec with a fresh loader. So the finder stays on
    the path until torch has actually been executed, wraps each spec's loader, and `then` is
    guarded to run once (a reload executes torch again). It leaves the path by replacing the
    list, not by removing itself from it: a thread importing at the same time iterates the old
    list, and a removal would make its iterator skip the finder after this one."""

    def __init__(self, then: "Callable[[], None]", module: str = "torch") -> None:
        self.then = then
        self.module = module  # the module waited for (torch; or pynvml, `found`)
        self.ran = False

    def __repr__(self) -> str:
        return f"AfterTorch(then={getattr(self.then, '__qualname__', self.then)!s})"

    def find_spec(self, name: str, path: "Any" = None, target: "ModuleType | None" = None
                  ) -> "ModuleSpec | None":
        if name != self.module or self.ran:
            return None
        finders = sys.meta_path
        after = finders[finders.index(self) + 1:] if self in finders else finders
        for finder in after:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        self._wrap(spec.loader)
        return spec

    def _wrap(self, loader: "Any") -> None:
        """Make `loader.exec_module` call `self._ran` after executing the module (once per
        loader: zipimport's loader is shared by every spec it finds)."""
        exec_module = getattr(loader, "exec_module", None)
        inner = exec_module
        while inner is not None:
            if getattr(inner, "_after_torch", None) is self:
                return
            inner = getattr(inner, "_inner", None)
        if exec_module is None:
            return

        def exec_then(module: "ModuleType") -> None:
            exec_module(module)
            self._ran()

        exec_then._after_torch = self  # type: ignore[attr-defined]
        exec_then._inner = exec_module  # type: ignore[attr-defined]
        loader.exec_module = exec_then  # this spec's loader

    def _ran(self) -> None:
        if self.ran:
            return
        self.ran = True
        if self in sys.meta_path:
            sys.meta_path = [f for f in sys.meta_path if f is not self]
        try:
            self.then()
        except KeyboardInterrupt:
            # Ctrl-C while devlab starts: raised from here, it would fail torch's import, which
            # drops the executed torch from sys.modules (the next `import torch` runs it again,
            # with its C++ half already loaded). torch stays imported; the interrupt is raised
            # again in the main thread, where it came from, once importlib has finished with
            # torch (a pending interrupt any sooner lands in importlib's own bytecode, which
            # drops torch all the same).
            print(f"devlab: interrupted while starting the simulated GPUs ({VARIABLE}): they "
                  "did not start; `import devlab` starts them.", file=sys.stderr)
            _interrupt_when_imported(self.module)

    def invalidate_caches(self) -> None:
        """Nothing cached (importlib.invalidate_caches calls this on every finder)."""


def _interrupt_when_imported(name: str, limit: float = 10.0) -> None:
    """Raise KeyboardInterrupt in the main thread once module `name` is no longer being
    imported (or after `limit` seconds), from a thread of its own."""
    import _thread
    import threading
    import time

    def wait() -> None:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            spec = getattr(sys.modules.get(name), "__spec__", None)
            if not getattr(spec, "_initializing", False):
                break
            time.sleep(0.001)
        _thread.interrupt_main()

    threading.Thread(target=wait, name="devlab-reraise-interrupt", daemon=True).start()


_finder = AfterTorch(_start)
# pynvml imported before torch (a program that asks NVML first): devlab starts, torch with it,
# once pynvml's module is executed, and points that module at the simulated GPUs (devlab answers
# a pynvml imported before it as one imported after).
_nvml_finder = AfterTorch(_start, "pynvml")


def found(line_finder: "Any", name: str, path: "Any" = None, target: "ModuleType | None" = None
          ) -> "ModuleSpec | None":
    """The .pth line's finder (`line_finder`) met torch's import, or pynvml's, with the variable
    set: this module's finder takes its place on `sys.meta_path` (a new list, as `_ran` makes,
    for a thread iterating the old one), and the spec for the module is its."""
    sys.meta_path = [f for f in sys.meta_path if f is not line_finder]
    install()
    if name == _nvml_finder.module and "torch" not in sys.modules:
        if _nvml_finder not in sys.meta_path:  # site may run the line twice (a pyenv venv does)
            sys.meta_path = [_nvml_finder, *sys.meta_path]
        return _nvml_finder.find_spec(name, path, target)
    return _finder.find_spec(name, path, target) if _finder in sys.meta_path else None


def install() -> None:
    """Start the simulation once torch is imported (at once if it already is)."""
    if "torch" in sys.modules:
        _start()
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


if os.environ.get(VARIABLE, "").strip() not in ("", "0"):  # as the .pth line asks
    install()
