"""Tracebacks that end at the user's line: devlab's own frames taken out of an error's chain."""

from __future__ import annotations

from collections.abc import Callable


def drop_frames(err: BaseException, own: Callable[[str], bool]) -> None:
    """Unlink from `err`'s traceback every frame whose file name `own` accepts. The caller
    re-raises with a bare `raise`, which keeps the edited traceback on Python 3.11+."""
    kept = []
    tb = err.__traceback__
    while tb is not None:
        if not own(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    for outer, inner in zip(kept, kept[1:], strict=False):
        outer.tb_next = inner
    if kept:
        kept[-1].tb_next = None
    err.__traceback__ = kept[0] if kept else None
