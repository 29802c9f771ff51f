"""The undo log: every change the simulation makes to torch (and Python) goes through one
`Patcher`, so that stop() puts back the very same objects."""

from __future__ import annotations

from collections.abc import Callable

_MISSING = object()


class Patcher:
    """setattr with a record; restore() undoes every change in reverse order, exactly."""

    def __init__(self) -> None:
        self._undo: list[tuple[object, str, object] | Callable[[], None]] = []

    def set(self, obj: object, name: str, value: object) -> None:
        # Only the object's own attribute is saved: an inherited one is "restored" by deleting
        # ours, so e.g. torch.Tensor.device is again looked up on torch._C.TensorBase.
        own = vars(obj).get(name, _MISSING)
        self._undo.append((obj, name, own))
        setattr(obj, name, value)

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
                obj, name, own = entry
                if own is _MISSING:
                    delattr(obj, name)
                else:
                    setattr(obj, name, own)
            except Exception as e:  # keep restoring the rest
                errors.append(e)
        if errors:
            raise errors[0]
