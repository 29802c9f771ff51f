"""Patching a module when a program imports it: for torch modules that take seconds to import
or that torch imports only on some paths, so the simulation does not import them itself."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from devlab.engine.simulated.base.patcher import Patcher


class _AfterImport(MetaPathFinder):
    """Finds nothing itself: when module `name` is imported, `then(module)` runs as soon as
    the module is complete."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, name: str, path: Any = None, target: ModuleType | None = None
                  ) -> ModuleSpec | None:
        if name != self.name:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if finder is not self and find else None
            if spec is not None:
                break
        else:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is None:
            return spec
        then = self.then

        def exec_then(module: ModuleType) -> None:
            exec_module(module)
            then(module)

        spec.loader.exec_module = exec_then  # type: ignore[union-attr]  # this spec's loader
        return spec


def when_imported(p: Patcher, name: str, patch: Callable[[ModuleType], None]) -> None:
    """`patch(module)` now if module `name` is imported, else as soon as it is; `p` undoes the
    waiting on restore (the patch itself records its own changes in `p`)."""
    if name in sys.modules:
        patch(sys.modules[name])
        return
    finder = _AfterImport(name, patch)
    sys.meta_path.insert(0, finder)
    p.on_restore(functools.partial(_remove, finder))


def _remove(finder: MetaPathFinder) -> None:
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
