"""How a mistake in a magic's own arguments reaches the user: as a one-line `UsageError`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from IPython.core.error import UsageError

# What devlab raises for a bad name, option or setting. Anything else is a fault, not a
# mistake in the arguments, and keeps its traceback.
_MISTAKES = (ValueError, RuntimeError, TypeError)


@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """Turn devlab's errors about the arguments checked inside the block into a `UsageError`
    (IPython shows it as one line, with no traceback into devlab)."""
    try:
        yield
    except _MISTAKES as e:
        lines = str(e).strip().splitlines()
        raise UsageError(lines[0] if lines else type(e).__name__) from None
