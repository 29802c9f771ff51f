"""Patching a module when a program imports it: for torch modules that take seconds to import
or that torch imports only on some paths, so the simulation does not import them itself; and
patching a module again when a program reloads it (`importlib.reload(torch.cuda)`, IPython's
autoreload), which executes it afresh and so would undo the simulation's changes to it."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from devlab.engine.simulated.base.patcher import Patcher


def _spec_then(finder: MetaPathFinder, name: str, path: Any, target: ModuleType | None,
               then: Callable[[ModuleType], None]) -> ModuleSpec | None:
    """The spec the other finders give for `name`, its loader made to call `then(module)`
    once it has executed the module (None: no other finder has it)."""
    for other in sys.meta_path:
        find = getattr(other, "find_spec", None)
        spec = find(name, path, target) if other is not finder and find else None
        if spec is not None:
            break
    else:
        return None
    exec_module = getattr(spec.loader, "exec_module", None)
    if exec_module is None:
        return spec

    def exec_then(module: ModuleType) -> None:
        exec_module(module)
        then(module)

    spec.loader.exec_module = exec_then  # type: ignore[union-attr]  # this spec's loader
    return spec


class _AfterImport(MetaPathFinder):
    """Finds nothing itself: when module `name` is imported, `then(module)` runs as soon as
    the module is complete. (A reload is `_OnReload`'s.)"""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, name: str, path: Any = None, target: ModuleType | None = None
                  ) -> ModuleSpec | None:
        if name != self.name or target is not None:
            return None
        return _spec_then(self, name, path, target, self.then)


class _OnReload(MetaPathFinder):
    """Finds nothing itself: when a module the patcher changed is reloaded (importlib.reload
    asks the finders for its spec again, with the module as `target`), the patcher sets its
    changes again once the module has been executed afresh."""

    def __init__(self, p: Patcher) -> None:
        self.patcher = p

    def find_spec(self, name: str, path: Any = None, target: ModuleType | None = None
                  ) -> ModuleSpec | None:
        if target is None or name not in self.patcher.modules():
            return None
        return _spec_then(self, name, path, target, self.patcher.reapply)


def when_imported(p: Patcher, name: str, patch: Callable[[ModuleType], None]) -> None:
    """`patch(module)` now if module `name` is imported, else as soon as it is; `p` undoes the
    waiting on restore (the patch itself records its own changes in `p`)."""
    if name in sys.modules:
        patch(sys.modules[name])
        return
    finder = _AfterImport(name, patch)
    sys.meta_path.insert(0, finder)
    p.on_restore(functools.partial(_remove, finder))


def reapply_on_reload(p: Patcher) -> None:
    """From now until `p` restores, a reload of a module `p` changed keeps the changes."""
    finder = _OnReload(p)
    sys.meta_path.insert(0, finder)
    p.on_restore(functools.partial(_remove, finder))


def _remove(finder: MetaPathFinder) -> None:
    # A new list, not a removal from the old: a thread importing now iterates the old one.
    if finder in sys.meta_path:
        sys.meta_path = [f for f in sys.meta_path if f is not finder]
