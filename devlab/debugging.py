"""TensorFlow's `tf.debugging.set_log_device_placement`, for PyTorch.

Unlike TensorFlow, switching it takes effect at once, not only at start-up. In a notebook
with `%load_ext devlab`, each cell's log is shown under that cell when it ends; elsewhere
lines are written to standard output as ops run.
"""

from __future__ import annotations

import sys
from typing import IO

from devlab import placement_log
from devlab.placement_log import PlacementLog

_enabled = False
_running: PlacementLog | None = None
_finished: list[PlacementLog] = []
# Set by the notebook extension: buffer each cell's log and show it when the cell ends.
per_cell = False


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


def start_log(stream: IO[str] | None = None) -> PlacementLog:
    """Start the switch's log now, if it is not running (buffered per cell in a notebook)."""
    global _running
    if _running is None:
        if stream is None and not per_cell:
            stream = sys.stdout
        _running = placement_log.start(stream=stream)
    return _running


def finish_log() -> PlacementLog | None:
    """Stop the running log and keep it to be shown; returns it."""
    global _running
    log, _running = _running, None
    if log is not None:
        placement_log.stop(log)
        _finished.append(log)
    return log


def take_finished() -> list[PlacementLog]:
    """The logs finished since the last call (the notebook extension shows them)."""
    logs = list(_finished)
    _finished.clear()
    return logs


def reset() -> None:
    """Switch off and forget every log (used by `%unload_ext devlab`)."""
    global _enabled, per_cell
    _enabled = False
    finish_log()
    _finished.clear()
    per_cell = False
