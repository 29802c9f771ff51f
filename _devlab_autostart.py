"""devlab's start-up hook: with DEVLAB_SIMULATE_GPUS=N set, every Python process sees N simulated
GPUs, without importing devlab.

pip installs `devlab-autostart.pth` into site-packages with devlab (regular and editable
installs); Python runs its one line at start-up, which imports this module only when the
variable is set, so other processes pay for a look at os.environ and nothing more. This
module imports nothing itself (`os` and `sys` are loaded at start-up already; its type hints
are never evaluated): it waits for the program's own `import torch`, then imports devlab,
which starts the simulation (`devlab.config.simulate_from_environment`). So a script written
for real GPUs, and every process it starts (torch.multiprocessing.spawn, multiprocessing with
spawn, fork or forkserver, torchrun's workers, DataLoader workers), sees the simulated GPUs:
the way coverage.py measures subprocesses. A process that never imports torch pays for
compiling nothing and importing nothing but this small module (`python -X importtime`).
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
    it) that finds nothing itself: when `torch` is imported, it wraps the loader that will
    execute it, so that `then()` runs as soon as torch is complete. (The conformance corpus's
    observer of rank processes uses one too.)"""

    def __init__(self, then: "Callable[[], None]") -> None:
        self.then = then

    def __repr__(self) -> str:
        return f"AfterTorch(then={getattr(self.then, '__qualname__', self.then)!s})"

    def find_spec(self, name: str, path: "Any" = None, target: "ModuleType | None" = None
                  ) -> "ModuleSpec | None":
        if name != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec
        then = self.then

        def exec_then(module: "ModuleType") -> None:
            exec_module(module)
            then()

        loader.exec_module = exec_then  # this spec's loader
        return spec

    def invalidate_caches(self) -> None:
        """Nothing cached (importlib.invalidate_caches calls this on every finder)."""


_finder = AfterTorch(_start)


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
