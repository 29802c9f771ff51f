"""The simulated machine's register of GPU use: what each process of one simulated machine holds
on each GPU, shared through the file system of this host (no socket), so that NVML and
`nvidia-smi` answer for every process as a real driver does (torchrun's ranks, `mp.spawn`,
a second kernel on the same machine).

A machine is named by a key (`machine_key`: the group named by `DEVLAB_SIMULATED_MACHINE`,
which children inherit through the environment, and the GPUs it simulates). Its register is a directory (`directory(key)`, under /dev/shm where there is one,
else the temporary directory) holding one small JSON file per process that holds GPU memory:
its pid, its start time (so that a reused pid is not taken for it), its name, the bytes it uses
on each GPU (CUDA context, the caching allocator's reserved memory, memory outside it such as
NCCL's buffers) and each GPU's utilization it measured. A `Publisher` writes it from a background
thread when those figures change (looked at every `interval` seconds, written only on change),
removes it at exit and at `stop()`, and removes the directory when it is the last.

See Note [Nothing left behind, even by SIGKILL].

Pure Python, no torch: `nvidia-smi` reads the register without importing torch.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

ENV = "DEVLAB_SIMULATED_MACHINE"
DEFAULT_GROUP = "shared"
_PREFIX = "devlab-gpus-"

# Note [Nothing left behind, even by SIGKILL]
# A process removes its own file at exit (atexit) and when its simulation stops, and the last
# one removes the directory. A process killed by SIGKILL runs neither, so two more things
# clean after it: every reader sweeps the files of processes that are gone (`entries`), and each
# publishing process starts one tiny watcher (`sh`, in its own session so a terminal's Ctrl-C
# does not reach it) that blocks reading a pipe only the publisher holds open. When the
# publisher dies, however it dies, the kernel closes the pipe; the watcher reads end-of-file,
# removes the file and tries the directory, and exits. So the register vanishes with its last
# process even if nobody reads it again. A forked child closes the inherited pipe end at once
# (`_after_fork`), so the parent's watcher does not wait for the child.


@dataclass(frozen=True)
class Entry:
    """One process's use of the simulated GPUs, as its file says."""

    pid: int
    name: str
    used: dict[int, int]  # GPU index -> bytes this process holds there
    utilization: dict[int, int]  # GPU index -> percent busy this process measured
    time: float  # when it was written (time.time())


@dataclass(frozen=True)
class Usage:
    """What a process publishes: bytes per GPU, and utilization in percent per GPU."""

    used: dict[int, int]
    utilization: dict[int, int]


def machine_key(count: int, model: str | None) -> str:
    """The key of the machine simulating `count` GPUs of `model`, in the group named by the
    inherited `DEVLAB_SIMULATED_MACHINE` (default "shared": every process of this user on this
    host that simulates the same GPUs is on one machine, as programs on one GPU server are).
    A child simulating other GPUs (a fresh process on a modeled T4 under a kernel with no model)
    is on a machine of its own."""
    group = os.environ.get(ENV, "").strip() or DEFAULT_GROUP
    return f"{group}-{count}x{model or 'unmodeled'}"


def board_uuid(key: str, index: int) -> uuid.UUID:
    """Simulated GPU `index`'s UUID on machine `key`, the one identity torch's device
    properties, NVML and `nvidia-smi` all give it (NVML and `nvidia-smi` write it after "GPU-"),
    as on a real GPU: the same in every process of the machine and on every call (a name-based
    UUID, so nothing random is stored), another on another machine."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"devlab-simulated-gpu:{key}:{index}")


def pci_bus(index: int) -> int:
    """Simulated GPU `index`'s PCI bus number (torch's `pci_bus_id`): `index + 1`, as a
    machine numbers its GPUs' slots, in domain 0, device 0."""
    return index + 1


def pci_bus_id(index: int) -> str:
    """The same bus as NVML and `nvidia-smi` write it: domain:bus:device.function,
    "00000000:01:00.0"."""
    return f"00000000:{pci_bus(index):02X}:00.0"


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:100] or "machine"


def _base() -> str:
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return tempfile.gettempdir()


def directory(key: str) -> str:
    """The register of machine `key` for this user (it may not exist: nobody holds memory)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(_base(), f"{_PREFIX}{uid}-{_safe(key)}")


def _start_time(pid: int) -> str | None:
    """The process's start time as the kernel counts it (None where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
    fields = stat[stat.rfind(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 else None


def alive(pid: int, start: str | None = None) -> bool:
    """Whether process `pid` still runs (and, given its start time, is still that process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if start is not None:
        now = _start_time(pid)
        if now is not None and now != start:
            return False  # the pid was reused by another process
    return True


def _process_name() -> str:
    """What NVML names a process: its executable."""
    return sys.executable or (sys.argv[0] if sys.argv else "python")


def entries(key: str, skip: int | None = None) -> list[Entry]:
    """Every live process's entry in machine `key`'s register, by pid (but `skip`'s, which the
    caller knows better); files of processes that are gone are removed (and the directory,
    once empty)."""
    path = directory(key)
    try:
        names = os.listdir(path)
    except OSError:
        return []
    found: list[Entry] = []
    for name in sorted(names):
        full = os.path.join(path, name)
        pid_text = name.removeprefix(".").split(".")[0]
        if not pid_text.isdecimal() or int(pid_text) == skip:
            continue
        if name.startswith("."):  # a write cut short: its writer is gone, or it is mid-write
            if not alive(int(pid_text)):
                _unlink(full)
            continue
        try:
            with open(full, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue  # replaced or removed while read
        pid = int(data.get("pid", pid_text))
        if not alive(pid, data.get("start")):
            _unlink(full)
            continue
        found.append(Entry(pid, str(data.get("name", "")),
                           {int(k): int(v) for k, v in data.get("used", {}).items()},
                           {int(k): int(v) for k, v in data.get("utilization", {}).items()},
                           float(data.get("time", 0.0))))
    if not found and skip is None:
        _rmdir(path)
    return found


def others_on_gpu(index: int, key: str | None = None) -> list[tuple[int, int]]:
    """(pid, bytes) of each other process of this machine (`key`; default: the one this
    process publishes to) holding memory on GPU `index`, as a real GPU's out-of-memory message
    lists them. Empty when nothing else is on it, or no simulation runs."""
    if key is None:
        mine = [p for p in _publishers if p.pid == os.getpid()]
        if not mine:
            return []
        key = mine[-1].key
    me = os.getpid()
    return [(e.pid, e.used[index]) for e in entries(key)
            if e.pid != me and e.used.get(index, 0) > 0]


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _rmdir(path: str) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)  # only an empty one: another process may have just written its file


_WATCHER = ('read _ignored; rm -f "$1"; rmdir "$2" 2>/dev/null; shift 2; '
            '[ "$#" -gt 0 ] && rm -rf "$@"; exit 0')


class Publisher:
    """This process's entry in machine `key`'s register: `read()` says what this process uses
    now (None: nothing to publish), looked at every `interval` seconds from a daemon thread and
    written when it changed. `flush()` writes at once; `stop()` removes the entry. `extra`:
    paths this process made that go with its entry (removed by the watcher, even after a
    SIGKILL; the watcher then starts at once rather than at the first write)."""

    def __init__(self, key: str, read: Callable[[], Usage | None],
                 interval: float = 0.05, extra: list[str] | None = None) -> None:
        self.key, self.read, self.interval = key, read, interval
        self.path = directory(key)
        self.pid = os.getpid()
        self.file = os.path.join(self.path, f"{self.pid}.json")
        self._start = _start_time(self.pid)
        self._name = _process_name()
        self._last: Usage | None = None
        self._written = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: subprocess.Popen | None = None
        self._pipe: int | None = None
        self._extra = list(extra or [])
        self._tried = False
        if self._extra:
            self._watch()
        self._thread = threading.Thread(target=self._run, name="devlab-gpu-register",
                                        daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"Publisher({self.key!r}, file={self.file!r})"

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.flush()
            except Exception:  # noqa: BLE001, S112 - a failed look is retried at the next tick
                continue

    def flush(self) -> None:
        """Write this process's entry now if what it uses changed (or remove it, if nothing)."""
        if os.getpid() != self.pid:
            return  # a forked child's copy: the child has its own
        usage = self.read()
        with self._lock:
            if self._stop.is_set() or usage == self._last:
                return
            self._last = usage
            if usage is None or not any(usage.used.values()):
                self._remove()
                return
            self._write(usage)

    def _write(self, usage: Usage) -> None:
        data = {"pid": self.pid, "start": self._start, "name": self._name,
                "used": {str(k): v for k, v in usage.used.items()},
                "utilization": {str(k): v for k, v in usage.utilization.items()},
                "time": time.time()}
        text = json.dumps(data)
        tmp = os.path.join(self.path, f".{self.pid}.json.tmp")
        for _ in range(3):  # the last process may remove the directory between two steps
            try:
                os.makedirs(self.path, mode=0o700, exist_ok=True)
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(text)
                os.replace(tmp, self.file)
            except FileNotFoundError:
                continue
            self._written = True
            break
        else:
            self._last = None  # not written: try again at the next look
            return
        if not self._tried:
            self._watch()

    def _watch(self) -> None:
        self._tried = True
        read_end, write_end = os.pipe()  # not inherited by exec'd children (PEP 446)
        try:
            self._watcher = subprocess.Popen(
                ["/bin/sh", "-c", _WATCHER, "sh", self.file, self.path, *self._extra],
                stdin=read_end,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:  # no /bin/sh: readers' sweeps still clean after a killed process
            os.close(write_end)
            write_end = -1
        finally:
            os.close(read_end)
        self._pipe = write_end if write_end >= 0 else None

    def _remove(self) -> None:
        if self._written:
            _unlink(self.file)
            self._written = False
        _rmdir(self.path)

    def stop(self) -> None:
        """Remove this process's entry (and the register, if it was the last) and end the
        thread and the watcher."""
        if os.getpid() != self.pid:
            return
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        with self._lock:
            self._remove()
            self._last = None
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self._pipe)
            self._pipe = None
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                self._watcher.wait(timeout=2)
            self._watcher = None

    def forget(self) -> None:
        """In a forked child: let go of the parent's entry and watcher without touching them."""
        self._stop.set()
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self._pipe)
            self._pipe = None
        self._watcher = None
        self._written = False


_publishers: list[Publisher] = []


def publish(key: str, read: Callable[[], Usage | None], interval: float = 0.05,
            extra: list[str] | None = None) -> Publisher:
    """Start publishing this process's use of machine `key`'s GPUs (see `Publisher`)."""
    p = Publisher(key, read, interval, extra)
    _publishers.append(p)
    return p


def publishing() -> bool:
    """Whether this process publishes its GPU use."""
    return any(p.pid == os.getpid() for p in _publishers)


def unpublish(p: Publisher) -> None:
    """Stop `p` and remove its entry."""
    if p in _publishers:
        _publishers.remove(p)
    p.stop()


def _at_exit() -> None:
    for p in list(_publishers):
        with contextlib.suppress(Exception):
            unpublish(p)


def _after_fork() -> None:
    for p in _publishers:
        p.forget()
    _publishers.clear()


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
