"""`%device`, `%%device`, `%placement_log`, `%devices`: thin wrappers over devlab's core."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from devlab.core import config, debugging, inventory, placement_log
from devlab.core import placement_scope as scope
from devlab.core.names import full_name
from devlab.core.placement_log import DEFAULT_LIMIT, PlacementLog
from devlab.fronts.lab.magics.cell import run_body
from devlab.fronts.lab.magics.usage import parse_args, usage_errors


class LogView:
    """A finished log as shown under a cell: collapsed past `limit` lines."""

    def __init__(self, log: PlacementLog, limit: int = DEFAULT_LIMIT) -> None:
        self.log = log
        self.limit = limit

    def _repr_html_(self) -> str:
        return self.log.render_html(self.limit)

    def __repr__(self) -> str:
        return self.log.render_text(self.limit)


@magics_class
class PlacementMagics(Magics):
    """Device placement in the notebook, the TensorFlow guide's way."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.limit = DEFAULT_LIMIT
        self.file: Path | None = None
        self._pending: list[PlacementLog] = []
        self._cell_limit: int | None = None  # a cell magic's own --limit

    def __repr__(self) -> str:
        state = "on" if debugging.get_log_device_placement() else "off"
        file = f", --file {self.file}" if self.file is not None else ""
        return f"PlacementMagics(%device, %placement_log {state}, --limit {self.limit}{file}, %devices)"

    # -- %device / %%device ------------------------------------------------------------------

    @magic_arguments()
    @argument("name", nargs="?", help="A device: /GPU:1, /device:GPU:1, GPU:1, cuda:1, /CPU:0 ...")
    @argument("--soft", action="store_true", help="Fall back to an existing device (and log it) if NAME does not exist.")
    @argument("--log", action="store_true", help="(cell) Show the placement log of this cell.")
    @argument("--limit", type=int, default=None, help="(cell, with --log) Show at most this many log lines.")
    @argument("--reset", action="store_true", help="(line) Undo %%device NAME: back to the default device before.")
    @line_cell_magic
    def device(self, line: str, cell: str | None = None) -> Any:
        """Run a cell on a device named the TensorFlow way, or set the session's default device.

        %%device /GPU:1 [--soft] [--log]   run this cell with /GPU:1 as the default device
        %device /GPU:1                     make /GPU:1 the default for the rest of the session
        %device                            show the current default device
        %device --reset                    back to the default device before %device NAME

        Tensors and modules created in the cell land on the device; existing tensors do not
        move. A device that does not exist is an error unless --soft (or
        devlab.config.set_soft_device_placement(True)) is given.
        """
        __tracebackhide__ = True  # noqa: F841
        args = parse_args(self.device, line)
        _check_form(args, "device", cell is not None, line_only=("reset",), cell_only=("log", "limit"))
        if args.reset and args.name:
            raise UsageError("%device --reset goes back to the default device before; give it no name.")
        if args.limit is not None and not args.log:
            raise UsageError("--limit is the number of log lines to show: it goes with --log.")
        _check_limit(args.limit)
        soft = True if args.soft else None
        if cell is None:
            if args.reset:
                scope.reset_default()
                print(f"Default device: {full_name(scope.current_default())}")
            elif args.name:
                with usage_errors():
                    placement = scope.set_default(args.name, soft=soft)
                print(placement.note or f"Default device: {placement.full_name} (torch {placement.device})")
            else:
                print(f"Default device: {full_name(scope.current_default())} (torch {scope.current_default()})")
            return None
        if not args.name:
            raise UsageError("%%device needs a device name, e.g. %%device /GPU:0 or %%device /CPU:0.")
        with usage_errors():
            placement = scope.resolve(args.name, soft=soft)  # read once, here
        if args.log:
            # The log starts first so that it also shows a soft-placement fallback.
            return self._run_logged(cell, args.limit, scope=scope.device(placement),
                                    header=f"%%device {line}")
        with scope.device(placement):
            return run_body(self.shell, cell, f"%%device {line}")

    # -- %placement_log / %%placement_log --------------------------------------------------------

    @magic_arguments()
    @argument("state", nargs="?", choices=["on", "off"], help="(line) Switch the log on or off for every cell after.")
    @argument("--limit", type=int, default=None, help=f"Show at most this many lines under a cell (default {DEFAULT_LIMIT}).")
    @argument("--file", default=None, help="Also append every logged cell's full log to this file.")
    @line_cell_magic
    def placement_log(self, line: str, cell: str | None = None) -> Any:
        """Log which device every op runs on, copies between devices and host syncs.

        %placement_log on [--limit N] [--file PATH]   log every cell from now on
        %placement_log off
        %%placement_log [--limit N] [--file PATH]     log this cell only

        Lines read as TensorFlow's: "Executing op aten::mm in device
        /job:localhost/replica:0/task:0/device:CPU:0". Copies between devices and host syncs
        (.item(), .tolist(), .numpy(), .cpu(), printing a device tensor) are highlighted, and
        a summary ends the log. Long logs are collapsed; --file keeps every line.
        """
        __tracebackhide__ = True  # noqa: F841
        args = parse_args(self.placement_log, line)
        _check_limit(args.limit)
        if cell is not None:
            if args.state:
                raise UsageError("%%placement_log logs its own cell; on/off is for the line form %placement_log on.")
            file = _log_file(args.file)
            return self._run_logged(cell, args.limit, file, header=f"%%placement_log {line}")
        # Everything is checked before anything changes: a bad --file leaves the log as it was.
        file = _log_file(args.file)
        if args.limit is not None:
            self.limit = args.limit
        if file is not None:
            self.file = file
        if args.state == "on":
            debugging.set_log_device_placement(True)
            print("Placement log on: each cell's log appears under it"
                  + (f", and is appended to {self.file}." if self.file else "."))
        elif args.state == "off":
            debugging.set_log_device_placement(False)
            print("Placement log off.")
        else:
            print(f"Placement log is {'on' if debugging.get_log_device_placement() else 'off'}.")
        return None

    # -- %devices ------------------------------------------------------------------------------

    @magic_arguments()
    @argument("--simulate-gpus", type=int, default=None, metavar="N", help="First simulate N GPUs on the CPU (before first use).")
    @argument("--memory-limit", type=int, default=None, metavar="MB", help="With --simulate-gpus: each simulated GPU's memory.")
    @argument("--model", default=None, metavar="GPU", help="With --simulate-gpus: model the timing of this real GPU (T4, P100, V100, L4, A100-40GB, A100-80GB, H100, ...): times on the simulated GPUs are then modeled from its specifications, not measured.")
    @line_magic
    def devices(self, line: str) -> Any:
        """Show every device: type, name, torch device, memory, utilisation, real or simulated.

        %devices
        %devices --simulate-gpus 2 [--memory-limit 1024] [--model T4]
        """
        args = parse_args(self.devices, line)
        for flag, value in (("--memory-limit", args.memory_limit), ("--model", args.model)):
            if value is not None and args.simulate_gpus is None:
                raise UsageError(f"{flag} goes with --simulate-gpus N.")
        if args.simulate_gpus is not None:
            with usage_errors():
                config.simulate_gpus(args.simulate_gpus, memory_limit=args.memory_limit,
                                     model=args.model)
        return inventory.device_table()

    # -- helpers -----------------------------------------------------------------------------------

    def _run_logged(
        self,
        cell: str,
        limit: int | None,
        file: Path | None = None,
        scope: Any = None,
        header: str = "",
    ) -> Any:
        __tracebackhide__ = True  # noqa: F841
        with placement_log.capture() as log, scope or contextlib.nullcontext():
            try:
                return run_body(self.shell, cell, header)
            finally:
                self._pending.append(log)
                if file is not None:
                    _save(log, file, f"In [{self.shell.execution_count}] {header}".rstrip())
                self._cell_limit = limit

    # -- cell hooks (registered by the extension) ----------------------------------------------

    def pre_run_cell(self, info: Any = None) -> None:
        self._cell_limit = None
        if debugging.get_log_device_placement():
            debugging.start_log(per_cell=True)

    def post_run_cell(self, result: Any = None) -> None:
        debugging.finish_log()
        logs = debugging.take_finished()
        if self.file is not None:
            count = getattr(result, "execution_count", None)
            for log in logs:
                # A cell that ran no op (the one that turns the log off) adds nothing.
                if len(log) and not _save(log, self.file, f"In [{count}]"):
                    self.file = None  # said once; every later cell stays quiet
                    break
        # A cell that logged itself (%%placement_log, %%device --log) shows that log only, not
        # the switch's copy of the same ops as well.
        logs = list(self._pending) or logs
        self._pending.clear()
        limit = self._cell_limit if self._cell_limit is not None else self.limit
        for log in logs:
            if len(log):
                display(LogView(log, limit))


def _check_form(args: Any, magic: str, is_cell: bool, line_only: tuple[str, ...],
                cell_only: tuple[str, ...]) -> None:
    """A UsageError for an option given to the form of the magic it does nothing in."""
    for name in cell_only if not is_cell else line_only:
        if getattr(args, name) not in (None, False):
            form = f"cell form %%{magic}" if name in cell_only else f"line form %{magic}"
            raise UsageError(f"--{name} is for the {form} only.")


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 0:
        raise UsageError(f"--limit is the number of lines to show, 0 or more; got {limit}.")


def _log_file(path: str | None) -> Path | None:
    """The --file to append logs to, checked now: one that cannot be written is a UsageError
    here, not an error under every later cell."""
    if path is None:
        return None
    with usage_errors():
        return placement_log.check_log_file(path)


def _save(log: PlacementLog, file: Path, title: str) -> bool:
    """Append `log` to `file`; if that fails (the disk filled, the folder went), say so in one
    line instead of raising from a cell hook, and return False."""
    try:
        log.save(file, append=True, title=title)
    except OSError as e:
        print(f"devlab: could not append the placement log to {file} ({e.strerror or e}); "
              "%placement_log --file PATH writes to another file.", file=sys.stderr)
        return False
    return True
