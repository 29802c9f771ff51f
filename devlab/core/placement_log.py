"""The placement log: which device every op ran on, copies between devices, host syncs.

A `TorchDispatchMode` sees every aten op, including those autograd's backward pass runs.
Recording is kept to a tuple append per op; names and text are made only when the log is
shown. Copies and host syncs are the two costs the d2l chapter warns about, so they get
lines of their own:

- a copy is an `aten::_to_copy`/`aten::copy_` whose source and destination devices differ;
- a host sync is anything that makes the host wait for a device: reading a Python number
  (`.item()`, `float()`, `bool()`), a copy to the host (`.cpu()`, `.tolist()`, `.numpy()`),
  printing a device tensor, and ops whose output size depends on the data (`nonzero`).

torch.distributed's collectives (all-reduce, broadcast...) dispatch as `c10d` ops, also those
DistributedDataParallel issues from C++ for its gradients; each is a line with the bytes this
process sends into it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from devlab._helpers.sizes import format_bytes
from devlab.core.names import DeviceSpec, echo
from devlab.engine import simulated
from devlab.engine.aten_overloads import COPY_OPS, COPY_TO_HOST, SYNC_OPS, copy_ends
from devlab.engine.gpu_model import ops_catalog
from devlab.engine.simulated.mode import routing as _routing

OP, COPY, SYNC, NOTE, COLLECTIVE = "op", "copy", "sync", "note", "collective"

_CPU = torch.device("cpu")


# c10d op -> (its name in a log line, the argument holding the tensors this process sends).
_COLLECTIVE_OPS = {func: (op.collective, op.sends)
                   for func, op in ops_catalog.overloads("collective").items()}

DEFAULT_LIMIT = 60


@dataclasses.dataclass(frozen=True)
class Event:
    """One line of the log."""

    kind: str  # OP, COPY, SYNC or NOTE
    op: str
    device: torch.device | None = None
    source: torch.device | None = None
    nbytes: int = 0
    reason: str = ""

    def text(self) -> str:
        if self.kind == OP:
            return f"Executing op {self.op} in device {_full(self.device)}"
        if self.kind == COPY:
            return (
                f"Copy {format_bytes(self.nbytes)} from {_full(self.source)} to {_full(self.device)} "
                f"({self.op})"
            )
        if self.kind == SYNC:
            return f"Host sync: the host waited for {_full(self.device)} ({self.reason})"
        if self.kind == COLLECTIVE:
            size = "" if self.reason == "Barrier" else f" {format_bytes(self.nbytes)}"
            return f"{self.reason}{size} on {_full(self.device)} ({self.op})"
        return self.reason


@dataclasses.dataclass(frozen=True)
class Summary:
    """What a logged cell did: ops per device, copies and their bytes, host syncs."""

    ops_per_device: dict[str, int]
    copies: int
    copied_bytes: int
    syncs: int
    notes: int
    collectives: int = 0
    collective_bytes: int = 0

    def text(self) -> str:
        per_device = ", ".join(f"{_short(d)} {n:,}" for d, n in self.ops_per_device.items()) or "none"
        ops = sum(self.ops_per_device.values())
        collectives = (
            f" · {self.collectives:,} collective{_s(self.collectives)} ({format_bytes(self.collective_bytes)})"
            if self.collectives else ""
        )
        return (
            f"Placement summary: {ops:,} op{_s(ops)} ({per_device}) · "
            f"{self.copies:,} cop{'y' if self.copies == 1 else 'ies'} between devices ({format_bytes(self.copied_bytes)}) · "
            f"{self.syncs:,} host sync{_s(self.syncs)}{collectives}"
        )


# func -> (func, COPY, COLLECTIVE or OP, an op's host sync's reason or None), by id: an
# OpOverload hashes in Python (`hash(self._op)`), and the log asked up to three sets per op. The
# entry holds func, so no other object takes its id while the entry lives.
_roles: dict[int, tuple[Any, str, str | None]] = {}
_heads: dict[int, str] = {}  # id(func) -> an op's streamed line before its device
_gpus: dict[int, torch.device] = {}  # a simulated GPU's index -> torch.device("cuda", index)
_run_dispatched = simulated.run_dispatched


def _role(func: Any) -> tuple[Any, str, str | None]:
    """What the log does with `func`'s calls (`_roles`' entry, made at its first call)."""
    if func in COPY_OPS:
        role = (func, COPY, None)
    elif func in _COLLECTIVE_OPS:
        role = (func, COLLECTIVE, None)
    else:
        role = (func, OP, SYNC_OPS.get(func))
    _roles[id(func)] = role
    return role


class PlacementLog(TorchDispatchMode):
    """Records ops, copies and host syncs while active (`with PlacementLog() as log:`).

    With `stream`, each line is also written there as it happens (plain Python use);
    otherwise lines are only buffered, which is what keeps the log cheap.
    """

    marks_simulated = True  # each op it sees gets its simulated GPU (a backward pass needs one)
    # A higher-order operator (torch.cond, flex_attention) is one line, run whole below the log.
    supports_higher_order_operators = True

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__()
        self._raw: list[tuple[Any, ...]] = []
        self._streamed = 0  # lines already written to `stream`
        self.stream = stream

    # -- recording (hot path) ----------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        # Straight to the kernel, with the simulated GPU it runs on (None: the host or no
        # simulation; then the tensors say where it ran).
        out, index = _run_dispatched(func, args, kwargs)
        role = _roles.get(id(func))
        if role is None:
            role = _role(func)
        if role[1] is COPY:
            self._record_copy(func, args, kwargs, out, index)
        elif role[1] is COLLECTIVE:
            self._record_collective(func, args, out, index)
        else:
            raw = self._raw
            device = self._device_of(args, out, index)
            raw.append((OP, func, device))
            if role[2] is not None:
                self._record_sync(device, role[2])
            elif self.stream is not None and self._streamed == len(raw) - 1:
                # the one new line, as _flush_stream writes it (_event(raw).text())
                head = _heads.get(id(func))
                if head is None:
                    head = _heads[id(func)] = f"Executing op {_op_name(func)} in device "
                self.stream.write(head + _full(device) + "\n")
                self._streamed = len(raw)
                return out
        if self.stream is not None:
            self._flush_stream()
        return out

    def _device_of(self, args: tuple[Any, ...], out: Any, index: int | None) -> torch.device:
        if index is not None:
            device = _gpus.get(index)
            if device is None:  # torch.device("cuda", index), made once per index
                device = _gpus[index] = torch.device("cuda", index)
            return device
        for a in args:
            if isinstance(a, torch.Tensor):
                return a.device
            if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
                return a[0].device
        if isinstance(out, torch.Tensor):
            return out.device
        return _CPU

    def _record_copy(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                     index: int | None) -> None:
        src_dev, dst_dev, nbytes, blocking = copy_ends(func, args, kwargs, out, index)
        if src_dev == dst_dev:
            self._raw.append((OP, func, dst_dev))
            return
        self._raw.append((COPY, func, dst_dev, src_dev, nbytes))
        if dst_dev.type == "cpu" and blocking:
            self._record_sync(src_dev, COPY_TO_HOST)

    def _record_collective(self, func: Any, args: tuple[Any, ...], out: Any, index: int | None) -> None:
        label, which = _COLLECTIVE_OPS[func]
        tensors = [t for t in _flat(args[which] if which < len(args) else ()) if isinstance(t, torch.Tensor)]
        # A barrier's tensor is a placeholder: nothing is sent.
        nbytes = 0 if label == "Barrier" else sum(t.numel() * t.element_size() for t in tensors)
        self._raw.append((COLLECTIVE, func, self._device_of((tensors,), out, index), label, nbytes))

    def _record_sync(self, device: torch.device, reason: str) -> None:
        if device.type != "cpu":
            self._raw.append((SYNC, None, device, reason))

    def note(self, text: str) -> None:
        """Add a line of explanation (a soft-placement fallback, for example)."""
        self._raw.append((NOTE, None, None, text))
        if self.stream is not None:
            self._flush_stream()

    def host_sync(self, device: torch.device, reason: str) -> None:
        """Record a host sync seen outside dispatch (printing turns dispatch modes off)."""
        self._record_sync(device, reason)
        if self.stream is not None:
            self._flush_stream()

    def _flush_stream(self) -> None:
        assert self.stream is not None
        for raw in self._raw[self._streamed:]:
            self.stream.write(_event(raw).text() + "\n")
        self._streamed = len(self._raw)

    # -- reading -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._raw)

    @property
    def events(self) -> list[Event]:
        return [_event(raw) for raw in self._raw]

    def lines(self) -> list[str]:
        """Every line of the log as text."""
        return [_event(raw).text() for raw in self._raw]

    def summary(self) -> Summary:
        ops: Counter[str] = Counter()
        copies = copied = syncs = notes = collectives = collected = 0
        for raw in self._raw:
            kind = raw[0]
            if kind == OP:
                ops[_full(raw[2])] += 1
            elif kind == COPY:
                copies += 1
                copied += raw[4]
            elif kind == SYNC:
                syncs += 1
            elif kind == COLLECTIVE:
                collectives += 1
                collected += raw[4]
            else:
                notes += 1
        return Summary(dict(ops), copies, copied, syncs, notes, collectives, collected)

    def records(self) -> list[tuple[Any, ...]]:
        """The log as plain data (op names instead of torch's op objects), to send to another
        process; `PlacementLog.from_records` makes the log again there."""
        return [(raw[0], raw[1] if raw[1] is None or isinstance(raw[1], str) else _op_name(raw[1]), *raw[2:])
                for raw in self._raw]

    @classmethod
    def from_records(cls, records: list[tuple[Any, ...]]) -> PlacementLog:
        """A finished log holding `records` (from `records()`), to read and show."""
        log = cls()
        log._raw = list(records)
        return log

    def save(self, path: str | Path, append: bool = False, title: str | None = None) -> Path:
        """Write every line and the summary to a text file (after what it holds, if `append`),
        under `# title` if given (which cell the lines are from)."""
        path = Path(path)
        with path.open("a" if append else "w") as f:
            if title is not None:
                f.write(f"# {title}\n")
            for raw in self._raw:
                f.write(_event(raw).text() + "\n")
            f.write(self.summary().text() + "\n")
        return path

    def render_text(self, limit: int = DEFAULT_LIMIT) -> str:
        """The log as text: at most `limit` lines, then a count of the rest, then the summary."""
        shown, hidden = self._collapse(limit)
        out = [e.text() for e in shown]
        if hidden:
            out.append(self._hidden_text(hidden))
        out.append(self.summary().text())
        return "\n".join(out)

    def render_html(self, limit: int = DEFAULT_LIMIT) -> str:
        """The log as HTML: one <pre> (never one node per op), copies and syncs highlighted."""
        shown, hidden = self._collapse(limit)
        rows = []
        for e in shown:
            text = html.escape(e.text())
            if e.kind == COPY:
                rows.append(f'<span class="devlab-copy" style="background:#fff3cd;font-weight:bold">{text}</span>')
            elif e.kind == SYNC:
                rows.append(f'<span class="devlab-sync" style="background:#f8d7da;font-weight:bold">{text}</span>')
            elif e.kind == NOTE:
                rows.append(f'<span class="devlab-note" style="background:#d1ecf1">{text}</span>')
            elif e.kind == COLLECTIVE:
                rows.append(f'<span class="devlab-collective" style="background:#e2d9f3;font-weight:bold">{text}</span>')
            else:
                rows.append(text)
        if hidden:
            rows.append(f"<i>{html.escape(self._hidden_text(hidden))}</i>")
        return (
            '<div class="devlab-placement-log">'
            '<pre style="max-height:24em;overflow:auto;font-size:85%;margin:0">'
            + "\n".join(rows)
            + f'</pre><div class="devlab-summary" style="font-weight:bold">{html.escape(self.summary().text())}</div></div>'
        )

    def _repr_html_(self) -> str:
        return self.render_html()

    def __repr__(self) -> str:
        return self.render_text()

    def _collapse(self, limit: int) -> tuple[list[Event], Counter[str]]:
        """The first `limit` lines as events, and how many lines of each kind are left out."""
        if limit < 0:
            raise ValueError(f"limit is the number of log lines to show, 0 or more; got {limit}.")
        shown = [_event(raw) for raw in self._raw[:limit]]
        return shown, Counter(raw[0] for raw in self._raw[limit:])

    @staticmethod
    def _hidden_text(hidden: Counter[str]) -> str:
        n = sum(hidden.values())
        return (
            f"… {n:,} more line{_s(n)} not shown "
            f"({hidden[COPY]:,} cop{'y' if hidden[COPY] == 1 else 'ies'}, {hidden[SYNC]:,} host sync{_s(hidden[SYNC])} among them; "
            "save the whole log with log.save(path) or %placement_log --file PATH)"
        )


# --- which logs are active ---------------------------------------------------------------------

_local = threading.local()


def active_logs() -> list[PlacementLog]:
    """The logs recording in this thread, innermost last."""
    return getattr(_local, "stack", [])


def note_fallback(placement: Any) -> None:
    """Tell the active logs that soft placement moved work to another device."""
    for log in active_logs():
        log.note(placement.note)


@contextlib.contextmanager
def capture(stream: IO[str] | None = None) -> Iterator[PlacementLog]:
    """Record placement for the block; the log is yielded and complete after it."""
    log = PlacementLog(stream=stream)
    with log:
        _push(log)
        try:
            yield log
        finally:
            _pop(log)


def start(stream: IO[str] | None = None) -> PlacementLog:
    """Start a log that stays on until `stop(log)` (for switches spanning cells)."""
    log = PlacementLog(stream=stream)
    log.__enter__()
    _push(log)
    return log


def stop(log: PlacementLog) -> None:
    """Stop a log started with `start`."""
    _pop(log)
    log.__exit__(None, None, None)


def _push(log: PlacementLog) -> None:
    stack = active_logs()
    if not stack:
        _patch_printing()
    _local.stack = [*stack, log]


def _pop(log: PlacementLog) -> None:
    stack = [entry for entry in active_logs() if entry is not log]
    _local.stack = stack
    if not stack:
        _unpatch_printing()


def _note_finding(finding: Any) -> None:
    """A simulated GPU's finding (a non_blocking copy read early, a tensor freed while another
    stream uses it): a warning line among the log's, as it happened (the lab never errs)."""
    for log in active_logs():
        log.note(f"Warning: {finding}")


simulated.observe_findings(_note_finding)  # for good: it looks for this thread's logs
# The mode's fast path runs a call under the log, alone on the dispatch mode stack, as the full
# path does: See Note [The fast path under the log] in engine/simulated/mode/routing.py.
_routing.RECORDERS.add(PlacementLog)


# Printing a tensor turns dispatch modes off (torch._tensor_str._str), so the log cannot see
# the copy to the host there; the printing function itself is watched while a log runs.
_original_str = torch._tensor_str._str


def _logged_str(self: torch.Tensor, *args: Any, **kwargs: Any) -> str:
    device = self.device
    if device.type != "cpu":
        for log in active_logs():
            log.host_sync(device, "printing a device tensor copies it to the host")
    return _original_str(self, *args, **kwargs)


def _patch_printing() -> None:
    torch._tensor_str._str = _logged_str


def _unpatch_printing() -> None:
    if torch._tensor_str._str is _logged_str:
        torch._tensor_str._str = _original_str


# --- formatting ----------------------------------------------------------------------------------

_full_names: dict[torch.device, str] = {}


def _full(device: torch.device | None) -> str:
    if device is None:
        return "?"
    name = _full_names.get(device)
    if name is None:
        try:
            name = DeviceSpec.from_torch(device).full().to_string()
        except ValueError:  # meta, xpu, ...: torch's own name says enough
            name = str(device)
        _full_names[device] = name
    return name


def _short(full: str) -> str:
    return full.rsplit("/device:", 1)[-1]


def _event(raw: tuple[Any, ...]) -> Event:
    kind = raw[0]
    if kind == OP:
        return Event(OP, _op_name(raw[1]), raw[2])
    if kind == COPY:
        return Event(COPY, _op_name(raw[1]), raw[2], raw[3], raw[4])
    if kind == SYNC:
        return Event(SYNC, "", raw[2], reason=raw[3])
    if kind == COLLECTIVE:
        return Event(COLLECTIVE, _op_name(raw[1]), raw[2], nbytes=raw[4], reason=raw[3])
    return Event(NOTE, "", reason=raw[3])


def _op_name(func: Any) -> str:
    # aten.add.Tensor -> "aten::add": the overload says nothing about placement. A higher-order
    # operator has no schema: "higher_order::cond".
    if isinstance(func, str):
        return func
    schema = getattr(func, "_schema", None)
    return schema.name if schema is not None else f"higher_order::{func.name()}"


def _flat(value: Any) -> Iterator[Any]:
    """The items of nested lists (c10d ops take lists of lists of tensors)."""
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _flat(v)
    else:
        yield value


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def check_log_file(path: str | Path) -> Path:
    """`path` as a `Path` if a log can be appended to it (opening it to append creates it when
    it does not exist), else a one-line `ValueError` saying why and what would work."""
    path = Path(path).expanduser()
    where = f"Cannot write the placement log to {echo(str(path))}"
    try:
        with path.open("a"):
            pass
    except IsADirectoryError:
        raise ValueError(f"{where}: it is a folder; give a file's path, such as placement.log.") from None
    except FileNotFoundError as e:
        if not path.parent.is_dir():
            raise ValueError(f"{where}: the folder {echo(str(path.parent))} does not exist.") from None
        raise ValueError(f"{where}: {e.strerror}.") from None
    except PermissionError:
        raise ValueError(f"{where}: no permission to write there; give a path in a folder you "
                         "can write to.") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL character in the path
        raise ValueError(f"{where}: {getattr(e, 'strerror', None) or e}.") from None
    return path
