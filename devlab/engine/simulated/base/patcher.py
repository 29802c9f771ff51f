"""The undo log: every change the simulation makes to torch (and Python) goes through one
`Patcher`, so that stop() puts back the very same objects."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

_MISSING = object()


class Patcher:
    """setattr with a record; restore() undoes every change in reverse order, exactly."""

    def __init__(self) -> None:
        # (object, attribute, its own value before, the value set), or a call to make.
        self._undo: list[tuple[object, str, object, object] | Callable[[], None]] = []

    def set(self, obj: object, name: str, value: object) -> None:
        # Only the object's own attribute is saved: an inherited one is "restored" by deleting
        # ours, so e.g. torch.Tensor.device is again looked up on torch._C.TensorBase.
        own = vars(obj).get(name, _MISSING)
        self._undo.append((obj, name, own, value))
        setattr(obj, name, value)

    def modules(self) -> set[str]:
        """The names of the modules it changed attributes of, or of classes defined there."""
        return {obj.__name__ if isinstance(obj, ModuleType) else getattr(obj, "__module__", "")
                for obj, *_ in (e for e in self._undo if not callable(e))}

    def reapply(self, module: ModuleType) -> None:
        """`module` was executed again (`importlib.reload`), which put fresh objects in its
        namespace: set again what was set on it, each change now undone to the fresh object
        (the module as the reload left it), and on each class it defined and now defines
        anew (a new object, changed as the old one was)."""
        fresh: set[str] = set()
        for i, entry in enumerate(list(self._undo)):
            if callable(entry):
                continue
            obj, name, own, value = entry
            if obj is module:
                if name not in fresh:  # the first change of it undoes to the fresh value
                    fresh.add(name)
                    self._undo[i] = (obj, name, vars(module).get(name, _MISSING), value)
                setattr(module, name, value)
            elif (isinstance(obj, type) and obj.__module__ == module.__name__
                  and "." not in obj.__qualname__):
                anew = vars(module).get(obj.__qualname__)
                if isinstance(anew, type) and anew is not obj:
                    self.set(anew, name, value)

    def on_restore(self, undo: Callable[[], None]) -> None:
        """Run `undo` when restoring, in its place among the recorded changes."""
        self._undo.append(undo)

    def restore(self) -> None:
        errors: list[BaseException] = []
        while self._undo:
            entry = self._undo.pop()
            try:
                if callable(entry):
                    entry()
                    continue
                obj, name, own, _ = entry
                if own is _MISSING:
                    delattr(obj, name)
                else:
                    setattr(obj, name, own)
            except Exception as e:  # keep restoring the rest
                errors.append(e)
        if errors:
            raise errors[0]
