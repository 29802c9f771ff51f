"""TensorFlow's `tf.debugging.set_log_device_placement`, for PyTorch.

Unlike TensorFlow, switching it takes effect at once, not only at start-up: lines are
written to standard output as ops run. In a notebook with `%load_ext devlab`, each cell after
the switch has its own log (`start_log(per_cell=True)`), shown under the cell when it ends.
"""

from __future__ import annotations

import sys
from typing import IO

from devlab.core import placement_log
from devlab.core.placement_log import PlacementLog

_enabled = False
_running: PlacementLog | None = None
_finished: list[PlacementLog] = []  # per-cell logs not yet shown


def set_log_device_placement(enabled: bool) -> None:
    """Log the device of every op, copies between devices and host syncs (True) or stop (False)."""
    global _enabled
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False, got {enabled!r}.")
    _enabled = enabled
    if enabled:
        start_log()
    else:
        finish_log()


def get_log_device_placement() -> bool:
    """Whether placement logging is on."""
    return _enabled


def start_log(stream: IO[str] | None = None, *, per_cell: bool = False) -> PlacementLog:
    """Start the switch's log now, if it is not running.

    Its lines go to `stream` (standard output by default) as ops run; with `per_cell` (the
    notebook extension, at a cell's start) they are kept, to be shown when the cell ends.
    """
    global _running
    if _running is None:
        if stream is None and not per_cell:
            stream = sys.stdout
        _running = placement_log.start(stream=stream)
    return _running


def finish_log() -> PlacementLog | None:
    """Stop the running log and return it; a per-cell log is kept for `take_finished`."""
    global _running
    log, _running = _running, None
    if log is not None:
        placement_log.stop(log)
        if log.stream is None:  # a streamed log has been shown line by line already
            _finished.append(log)
    return log


def take_finished() -> list[PlacementLog]:
    """The per-cell logs finished since the last call (the notebook extension shows them)."""
    logs = list(_finished)
    _finished.clear()
    return logs


def reset() -> None:
    """Switch off and forget every log (used by `%unload_ext devlab`)."""
    global _enabled
    _enabled = False
    finish_log()
    _finished.clear()
