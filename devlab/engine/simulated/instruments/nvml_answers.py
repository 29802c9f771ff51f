"""What NVML answers for the simulated GPUs: each board's facts, each process's memory, and a
stand-in for the NVML library that pynvml (nvidia-ml-py) calls, unmodified.

pynvml reaches the driver's library through one object, `pynvml.nvmlLib`, whose C functions it
looks up by name (`_nvmlGetFunctionPointer`) and calls with ctypes arguments. While GPUs are
simulated, `install` puts a `SimulatedNvml` there (through the simulation's undo log, and when
pynvml is imported, if it is later): every pynvml function, however it was imported, then gets
the simulated machine's answers, and the errors of a real board (pynvml's own `NVMLError`
subclasses, from the return codes here): NOT_SUPPORTED for what the model has no honest value
of (temperature, power draw, fan), INVALID_ARGUMENT for a GPU index that does not exist,
NOT_FOUND for an unknown UUID or bus id.

Memory as NVML counts it (See Note [NVML's memory figures]). Pure except `local_view` (which
reads the running simulation) and `install`; no torch import, so `nvidia-smi` runs without it.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from devlab.engine.gpu_model.capacity import nvml_total_memory, total_memory
from devlab.engine.gpu_model.links import Topology, default_topology, topology
from devlab.engine.gpu_model.specs import GpuSpec, gpu
from devlab.engine.simulated.base import machine

# Note [NVML's memory figures]
# NVML's total is the board's memory (a T4's 15,360 MiB, `capacity.NVML_TOTAL_MIB`), more than
# the total CUDA reports (15,102 MiB): the rest the driver and firmware keep, which NVML's
# version-2 memory info calls `reserved`. nvidia-smi prints version 2's `used`: what processes
# hold (each one's CUDA context, the caching allocator's reserved segments, libraries' own
# buffers such as NCCL's), so an idle board reads 0 MiB. Version 1 (`nvmlDeviceGetMemoryInfo`
# without a version, what most Python code calls) counts the driver's reserved memory as used
# too, used + free == total: on a real idle A100 it reads 912 MB where version 2 reads 7.8 MB
# (rust-nvml/nvml-wrapper#57; scitix/sichek#113: "an idle GPU reports a few hundred MB-~1 GB
# used (driver reserved)"). Here the driver's reserved memory is modeled as NVML's total less
# CUDA's (258 MiB on a T4): what NVML counts that CUDA never offers.

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7

# A driver's version strings. The model has no driver: these are the versions of the published
# H100 table the layout follows (NVIDIA/nccl#1264: "NVIDIA-SMI 550.54.15 ... CUDA Version:
# 12.4"), so that code parsing them works; `nvidia-smi` says the GPUs are simulated.
DRIVER_VERSION = "550.54.15"
CUDA_DRIVER_VERSION = 12040
NVML_VERSION = "12.550.54.15"

# What the driver calls each board (nvmlDeviceGetName, torch's get_device_name on the board).
BOARD_NAMES: dict[str, str] = {
    "T4": "Tesla T4", "P4": "Tesla P4", "P100": "Tesla P100-PCIE-16GB",
    "V100": "Tesla V100-PCIE-32GB", "L4": "NVIDIA L4", "A100-40GB": "NVIDIA A100-SXM4-40GB",
    "A100-80GB": "NVIDIA A100-SXM4-80GB", "A100-PCIe-40GB": "NVIDIA A100-PCIE-40GB",
    "A100-PCIe-80GB": "NVIDIA A100 80GB PCIe", "H100": "NVIDIA H100 80GB HBM3",
    "H100-PCIe": "NVIDIA H100 PCIe", "TITAN-RTX": "NVIDIA TITAN RTX",
    # deviceQuery's `Device 0: "Tesla V100-SXM2-16GB"` (docs/gpu-memory-sources.md)
    "V100-SXM2-16GB": "Tesla V100-SXM2-16GB",
}

# Published maximum clocks (MHz: graphics and SM, memory) from `nvidia-smi -q` "Max Clocks":
# T4 NVIDIA/nvidia-docker#1628; P100 PCIe NVIDIA/nvidia-docker#1316 ("Max Customer Boost
# Clocks" 1328, memory 715); A100 SXM4 40 GB (400 W) NVIDIA/nvidia-docker#1648. Elsewhere the
# graphics clock is derived from the datasheet: FP32 peak / (2 x CUDA cores), and the memory
# clock is not answered (NOT_SUPPORTED).
MAX_CLOCKS_MHZ: dict[str, tuple[int, int | None]] = {
    "T4": (1590, 5001), "P100": (1328, 715), "A100-40GB": (1410, 1215),
}
# CUDA cores per SM by compute capability (the datasheets' cores / SMs, specs.py's `sms`).
CORES_PER_SM = {"6.0": 64, "6.1": 128, "7.0": 64, "7.5": 64, "8.0": 64, "8.9": 128, "9.0": 128}
PCIE_GEN = {"PCIe Gen3 x16": 3, "PCIe Gen4 x16": 4, "PCIe Gen5 x16": 5}

# NVML's topology levels (nvmlGpuTopologyLevel_t) and P2P status codes.
TOPOLOGY_SINGLE, TOPOLOGY_HOSTBRIDGE, TOPOLOGY_NODE = 10, 30, 40
P2P_OK, P2P_CHIPSET_NOT_SUPPORTED = 0, 1
P2P_CAPS_INDEX_NVLINK = 2
UTILIZATION_WINDOW_S = 1.0  # NVML's sample period is between 1/6 s and 1 s, by board


@dataclass(frozen=True)
class Board:
    """What one simulated GPU says about itself through NVML."""

    index: int
    name: str
    uuid: str
    pci_bus_id: str  # "00000000:01:00.0"
    total: int  # NVML's total memory, bytes
    reserved: int  # what the driver keeps of it (See Note [NVML's memory figures])
    compute_capability: tuple[int, int] | None
    sms: int | None
    max_graphics_mhz: int | None
    max_memory_mhz: int | None
    power_limit_w: float | None  # the board's maximum power (its datasheet's), the default limit
    pcie_gen: int | None
    modeled: bool  # on a model's clock: utilization is known


@dataclass(frozen=True)
class Description:
    """The simulated machine as a child process is told it (JSON in the launcher's folder)."""

    key: str
    count: int
    model: str | None
    topology: str | None
    limits: list[int | None]  # each GPU's memory limit, bytes (None: none)
    host_memory: int  # what an unmodeled, unlimited GPU has: the host's memory

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Description:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Process:
    """One process holding memory on the simulated GPUs."""

    pid: int
    name: str
    used: dict[int, int]  # GPU index -> bytes


@dataclass(frozen=True)
class View:
    """One look at the simulated machine: its boards, the processes on them, each GPU's
    utilization (percent; None where there is no model to say)."""

    boards: list[Board]
    processes: list[Process]
    utilization: list[int | None]
    topology: Topology | None
    description: Description = field(repr=False)

    def used(self, index: int) -> int:
        """What processes hold on GPU `index` (NVML v2's used, nvidia-smi's)."""
        return sum(p.used.get(index, 0) for p in self.processes)

    def free(self, index: int) -> int:
        b = self.boards[index]
        return max(0, b.total - b.reserved - self.used(index))

    def on_gpu(self, index: int) -> list[Process]:
        return [p for p in self.processes if p.used.get(index, 0) > 0]


def _spec(description: Description) -> GpuSpec | None:
    return gpu(description.model) if description.model else None


def boards(description: Description) -> list[Board]:
    """The boards of the simulated machine (pure)."""
    return list(_boards(description.to_json()))


@functools.lru_cache(maxsize=16)  # asked on every NVML call: one machine, a few descriptions
def _boards(text: str) -> tuple[Board, ...]:
    description = Description.from_json(text)
    spec = _spec(description)
    out = []
    for i in range(description.count):
        ident = machine.board_uuid(description.key, i)
        bus = machine.pci_bus_id(i)
        limit = description.limits[i] if i < len(description.limits) else None
        if spec is None:
            total = limit if limit is not None else description.host_memory
            out.append(Board(i, "Simulated GPU (CPU-backed)", f"GPU-{ident}", bus, total, 0,
                             None, None, None, None, None, None, False))
            continue
        nvml_total = nvml_total_memory(spec)
        published = MAX_CLOCKS_MHZ.get(spec.name)
        cores = CORES_PER_SM.get(spec.compute_capability)
        derived = (round(spec.fp32_tflops * 1e12 / (2 * spec.sms * cores) / 1e6)
                   if cores else None)
        major, minor = (int(x) for x in spec.compute_capability.split("."))
        out.append(Board(i, BOARD_NAMES.get(spec.name, spec.full_name), f"GPU-{ident}", bus,
                         nvml_total, nvml_total - total_memory(spec), (major, minor), spec.sms,
                         published[0] if published else derived,
                         published[1] if published else None, spec.board_power_w,
                         PCIE_GEN.get(spec.host_link), True))
    return tuple(out)


def machine_topology(description: Description) -> Topology | None:
    spec = _spec(description)
    if spec is None:
        return None
    return topology(description.topology, spec) if description.topology else default_topology(spec)


def view_from(description: Description, entries: list[machine.Entry],
              local: tuple[machine.Entry, list[int | None]] | None = None) -> View:
    """The machine as `entries` (the register's) say, with this process's own live `local`
    entry and utilization in place of its published one (pure)."""
    bs = boards(description)
    me = local[0].pid if local is not None else None
    others = [e for e in entries if e.pid != me]
    listed = others + ([local[0]] if local is not None else [])
    procs = [Process(e.pid, e.name, {i: b for i, b in e.used.items() if i < len(bs)})
             for e in sorted(listed, key=lambda e: e.pid) if any(e.used.values())]
    mine = local[1] if local is not None else []
    util: list[int | None] = []
    for b in bs:
        if not b.modeled:
            util.append(None)
            continue
        total = sum(e.utilization.get(b.index, 0) for e in others)
        if b.index < len(mine):
            total += mine[b.index] or 0
        util.append(min(100, total))
    return View(bs, procs, util, machine_topology(description), description)


# --------------------------------------------------------------------------------------------
# This process's figures (the running simulation)


class Sampler:
    """Each GPU's utilization as NVML samples it: the share of the modeled GPU's timeline it was
    busy, over the last `UTILIZATION_WINDOW_S` of this machine's time (0 when the program did
    not touch the GPU in that time). Fed from the register's thread and from queries."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, float, tuple[float, ...]]] = deque()
        self.lock = threading.Lock()

    def utilization(self, clock: Any, count: int) -> list[int | None]:
        if clock is None:
            return [None] * count
        now = time.monotonic()
        with clock.lock:
            host, busy = clock.host, tuple(clock.busy[clock.queue[i]] for i in range(count))
        with self.lock:
            if self.samples and len(self.samples[0][2]) != count:
                self.samples.clear()  # the GPUs were reconfigured
            self.samples.append((now, host, busy))
            while len(self.samples) > 2 and self.samples[1][0] <= now - UTILIZATION_WINDOW_S:
                self.samples.popleft()
            _, host0, busy0 = self.samples[0]
        span = host - host0
        if span <= 0:
            return [0] * count
        return [min(100, max(0, round(100 * (b - b0) / span)))
                for b, b0 in zip(busy, busy0, strict=True)]


_sampler = Sampler()


def local_usage() -> tuple[machine.Usage | None, list[int | None]]:
    """What this process holds on each simulated GPU (its CUDA context, reserved memory and
    memory outside the allocator, from the GPU's first use) and each GPU's utilization; None
    where there is nothing: no simulation, or a forked child that may not use the GPUs."""
    from devlab.engine.simulated.base import session as _session

    sess = _session.session
    if sess is None or _session.bad_fork:
        return None, []
    # Every live segment (a CUDA graph's private pools too), as cudaMemGetInfo counts them.
    used = {d.index: d.allocator.context + d.allocator.reserved_total
            for d in sess.devices if d.opened}
    util = _sampler.utilization(sess.charges.clock, sess.count)
    return machine.Usage(used, {i: u for i, u in enumerate(util) if u}), util


def local_description(key: str) -> Description | None:
    """The running simulation as a `Description` (None: no simulation)."""
    from devlab.engine.simulated.base import session as _session

    sess = _session.session
    if sess is None:
        return None
    spec = sess.spec
    charges = sess.charges
    topo = getattr(charges, "topology", None) if charges.clock is not None else None
    limits = [d.limit for d in sess.devices]
    return Description(key, sess.count, spec.name if spec is not None else None,
                       topo.key if topo is not None else None, limits, _host_memory())


def _host_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def local_view(key: str) -> View | None:
    """The machine as this process sees it now: the register's entries, and its own live."""
    description = local_description(key)
    if description is None:
        return None
    usage, util = local_usage()
    local = None
    if usage is not None:
        local = (machine.Entry(os.getpid(), machine._process_name(), usage.used,
                               usage.utilization, time.time()), util)
    return view_from(description, _others(key), local)


_OTHERS_TTL_S = 0.025  # the register changes every 50 ms at most: half that between reads
_others_seen: dict[str, tuple[float, list[machine.Entry]]] = {}


def _others(key: str) -> list[machine.Entry]:
    """The other processes' entries, read again when the last read is older than
    `_OTHERS_TTL_S` (a tool asking a dozen NVML questions per refresh reads the register once)."""
    now = time.monotonic()
    seen = _others_seen.get(key)
    if seen is None or now - seen[0] > _OTHERS_TTL_S:
        seen = (now, machine.entries(key, skip=os.getpid()))
        _others_seen.clear()
        _others_seen[key] = seen
    return seen[1]


# --------------------------------------------------------------------------------------------
# The library pynvml calls


def _target(ref: Any) -> Any:
    """What a ctypes `byref(x)` argument points to (x itself)."""
    return getattr(ref, "_obj", ref)


def _put_text(buf: Any, text: str) -> None:
    data = text.encode()[: max(0, len(buf) - 1)]
    buf.value = data


class SimulatedNvml:
    """A stand-in for libnvidia-ml's C functions, as pynvml calls them (return codes, ctypes
    out-arguments), answering from `view()`. A function not defined here answers
    NOT_SUPPORTED, as a board without that feature does."""

    devlab_simulated = True  # devlab.engine.nvml_reader, the reader of real GPUs, leaves this one alone

    def __init__(self, view: Callable[[], View | None]) -> None:
        self._view = view
        self._initialized = 0
        # One small buffer per GPU whose address is that GPU's handle (pynvml never reads it).
        self._handles: list[ctypes.Array] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml"):
            return self._not_supported
        raise AttributeError(name)

    @staticmethod
    def _not_supported(*args: Any) -> int:
        return NVML_ERROR_NOT_SUPPORTED

    # -- init and system

    def nvmlInitWithFlags(self, flags: Any) -> int:
        self._initialized += 1
        return NVML_SUCCESS

    def nvmlInit_v2(self) -> int:
        return self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> int:
        if self._initialized == 0:
            return NVML_ERROR_UNINITIALIZED
        self._initialized -= 1
        return NVML_SUCCESS

    def _now(self) -> View | None:
        return self._view() if self._initialized else None

    def nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        if not self._initialized:
            return NVML_ERROR_UNINITIALIZED
        _put_text(buf, DRIVER_VERSION)
        return NVML_SUCCESS

    def nvmlSystemGetNVMLVersion(self, buf: Any, size: Any) -> int:
        _put_text(buf, NVML_VERSION)
        return NVML_SUCCESS

    def nvmlSystemGetCudaDriverVersion(self, out: Any) -> int:
        _target(out).value = CUDA_DRIVER_VERSION
        return NVML_SUCCESS

    nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion

    def nvmlSystemGetProcessName(self, pid: Any, buf: Any, size: Any) -> int:
        v = self._now()
        if v is None:
            return NVML_ERROR_UNINITIALIZED
        for p in v.processes:
            if p.pid == pid.value:
                _put_text(buf, p.name)
                return NVML_SUCCESS
        return NVML_ERROR_NOT_FOUND

    # -- devices and handles

    def nvmlDeviceGetCount_v2(self, out: Any) -> int:
        v = self._now()
        if v is None:
            return NVML_ERROR_UNINITIALIZED
        _target(out).value = len(v.boards)
        return NVML_SUCCESS

    def _set_handle(self, out: Any, index: int) -> None:
        while len(self._handles) <= index:
            self._handles.append(ctypes.create_string_buffer(8))
        address = ctypes.addressof(self._handles[index])
        ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p)).contents.value = address

    def _board(self, handle: Any) -> tuple[View, Board] | int:
        v = self._now()
        if v is None:
            return NVML_ERROR_UNINITIALIZED
        address = ctypes.cast(handle, ctypes.c_void_p).value
        for i, buf in enumerate(self._handles):
            if ctypes.addressof(buf) == address and i < len(v.boards):
                return v, v.boards[i]
        return NVML_ERROR_INVALID_ARGUMENT

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, out: Any) -> int:
        v = self._now()
        if v is None:
            return NVML_ERROR_UNINITIALIZED
        i = index.value
        if not 0 <= i < len(v.boards):
            return NVML_ERROR_INVALID_ARGUMENT
        self._set_handle(out, i)
        return NVML_SUCCESS

    def _handle_where(self, out: Any, match: Callable[[Board], bool]) -> int:
        v = self._now()
        if v is None:
            return NVML_ERROR_UNINITIALIZED
        for b in v.boards:
            if match(b):
                self._set_handle(out, b.index)
                return NVML_SUCCESS
        return NVML_ERROR_NOT_FOUND

    def nvmlDeviceGetHandleByUUID(self, text: Any, out: Any) -> int:
        wanted = (text.value or b"").decode()
        return self._handle_where(out, lambda b: b.uuid == wanted)

    def nvmlDeviceGetHandleByPciBusId_v2(self, text: Any, out: Any) -> int:
        wanted = (text.value or b"").decode().upper()
        # NVML takes a short domain ("0000:01:00.0") as well as the full "00000000:01:00.0".
        return self._handle_where(out, lambda b: wanted.count(":") == 2 and (
            b.pci_bus_id.split(":", 1)[1] == wanted.split(":", 1)[1]))

    def _answer(self, handle: Any, fill: Callable[[View, Board], int | None]) -> int:
        got = self._board(handle)
        if isinstance(got, int):
            return got
        result = fill(*got)
        return NVML_SUCCESS if result is None else result

    def nvmlDeviceGetIndex(self, handle: Any, out: Any) -> int:
        return self._answer(handle, lambda v, b: setattr(_target(out), "value", b.index))

    nvmlDeviceGetMinorNumber = nvmlDeviceGetIndex

    def nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        return self._answer(handle, lambda v, b: _put_text(buf, b.name))

    def nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        return self._answer(handle, lambda v, b: _put_text(buf, b.uuid))

    def nvmlDeviceGetPciInfo_v3(self, handle: Any, out: Any) -> int:
        def fill(v: View, b: Board) -> None:
            info = _target(out)
            info.busId = b.pci_bus_id.encode()
            info.busIdLegacy = b.pci_bus_id[4:].encode()
            info.domain, info.bus, info.device = 0, b.index + 1, 0

        return self._answer(handle, fill)

    # -- memory and processes

    def nvmlDeviceGetMemoryInfo(self, handle: Any, out: Any) -> int:
        def fill(v: View, b: Board) -> None:
            m = _target(out)
            used = v.used(b.index)
            m.total, m.free, m.used = b.total, v.free(b.index), b.reserved + used

        return self._answer(handle, fill)

    def nvmlDeviceGetMemoryInfo_v2(self, handle: Any, out: Any) -> int:
        def fill(v: View, b: Board) -> None:
            m = _target(out)
            m.total, m.reserved = b.total, b.reserved
            m.free, m.used = v.free(b.index), v.used(b.index)

        return self._answer(handle, fill)

    def _processes(self, handle: Any, count: Any, array: Any) -> int:
        def fill(v: View, b: Board) -> int:
            procs = v.on_gpu(b.index)
            n = _target(count)
            if not procs:
                n.value = 0
                return NVML_SUCCESS
            if array is None or n.value < len(procs):
                n.value = len(procs)
                return NVML_ERROR_INSUFFICIENT_SIZE
            for slot, p in zip(array, procs, strict=False):
                slot.pid, slot.usedGpuMemory = p.pid, p.used[b.index]
                slot.gpuInstanceId = slot.computeInstanceId = 0xFFFFFFFF  # no MIG
            n.value = len(procs)
            return NVML_SUCCESS

        return self._answer(handle, fill)

    nvmlDeviceGetComputeRunningProcesses_v3 = _processes
    nvmlDeviceGetComputeRunningProcesses_v2 = _processes

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any, count: Any,
                                                 array: Any) -> int:
        def fill(v: View, b: Board) -> None:
            _target(count).value = 0

        return self._answer(handle, fill)

    nvmlDeviceGetGraphicsRunningProcesses_v2 = nvmlDeviceGetGraphicsRunningProcesses_v3
    nvmlDeviceGetMPSComputeRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses_v3

    # -- what the board is and does

    def nvmlDeviceGetUtilizationRates(self, handle: Any, out: Any) -> int:
        def fill(v: View, b: Board) -> int | None:
            u = v.utilization[b.index]
            if u is None:
                return NVML_ERROR_NOT_SUPPORTED
            rates = _target(out)
            rates.gpu, rates.memory = u, 0 if u == 0 else min(100, u)
            return None

        return self._answer(handle, fill)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> int:
        def fill(v: View, b: Board) -> int | None:
            if b.compute_capability is None:
                return NVML_ERROR_NOT_SUPPORTED
            _target(major).value, _target(minor).value = b.compute_capability
            return None

        return self._answer(handle, fill)

    def _clock(self, handle: Any, kind: Any, out: Any) -> int:
        def fill(v: View, b: Board) -> int | None:
            k = kind.value if hasattr(kind, "value") else int(kind)
            mhz = b.max_memory_mhz if k == 2 else b.max_graphics_mhz if k in (0, 1) else None
            if mhz is None:
                return NVML_ERROR_NOT_SUPPORTED
            _target(out).value = mhz
            return None

        return self._answer(handle, fill)

    # The modeled GPU runs at its boost clock throughout: current = maximum.
    nvmlDeviceGetClockInfo = _clock
    nvmlDeviceGetMaxClockInfo = _clock

    def _power_limit(self, handle: Any, out: Any) -> int:
        def fill(v: View, b: Board) -> int | None:
            if b.power_limit_w is None:
                return NVML_ERROR_NOT_SUPPORTED
            _target(out).value = round(b.power_limit_w * 1000)  # milliwatts
            return None

        return self._answer(handle, fill)

    nvmlDeviceGetPowerManagementLimit = _power_limit
    nvmlDeviceGetEnforcedPowerLimit = _power_limit
    nvmlDeviceGetPowerManagementDefaultLimit = _power_limit

    def nvmlDeviceGetPerformanceState(self, handle: Any, out: Any) -> int:
        return self._answer(handle, lambda v, b: setattr(_target(out), "value", 0))  # P0

    def nvmlDeviceGetPersistenceMode(self, handle: Any, out: Any) -> int:
        return self._answer(handle, lambda v, b: setattr(_target(out), "value", 0))

    def nvmlDeviceGetComputeMode(self, handle: Any, out: Any) -> int:
        return self._answer(handle, lambda v, b: setattr(_target(out), "value", 0))  # Default

    def nvmlDeviceGetMultiGpuBoard(self, handle: Any, out: Any) -> int:
        return self._answer(handle, lambda v, b: setattr(_target(out), "value", 0))

    def _pcie_gen(self, handle: Any, out: Any) -> int:
        def fill(v: View, b: Board) -> int | None:
            if b.pcie_gen is None:
                return NVML_ERROR_NOT_SUPPORTED
            _target(out).value = b.pcie_gen
            return None

        return self._answer(handle, fill)

    nvmlDeviceGetCurrPcieLinkGeneration = _pcie_gen
    nvmlDeviceGetMaxPcieLinkGeneration = _pcie_gen

    def _pcie_width(self, handle: Any, out: Any) -> int:
        def fill(v: View, b: Board) -> int | None:
            if b.pcie_gen is None:
                return NVML_ERROR_NOT_SUPPORTED
            _target(out).value = 16
            return None

        return self._answer(handle, fill)

    nvmlDeviceGetCurrPcieLinkWidth = _pcie_width
    nvmlDeviceGetMaxPcieLinkWidth = _pcie_width

    def nvmlDeviceGetNumGpuCores(self, handle: Any, out: Any) -> int:
        def fill(v: View, b: Board) -> int | None:
            cc = b.compute_capability
            cores = CORES_PER_SM.get(f"{cc[0]}.{cc[1]}") if cc else None
            if cores is None or b.sms is None:
                return NVML_ERROR_NOT_SUPPORTED
            _target(out).value = cores * b.sms
            return None

        return self._answer(handle, fill)

    # -- between two GPUs

    def _pair(self, a: Any, b: Any) -> tuple[View, Board, Board] | int:
        first = self._board(a)
        if isinstance(first, int):
            return first
        second = self._board(b)
        if isinstance(second, int):
            return second
        return first[0], first[1], second[1]

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any, out: Any) -> int:
        got = self._pair(a, b)
        if isinstance(got, int):
            return got
        v, _, _ = got
        _target(out).value = common_ancestor(v.topology)
        return NVML_SUCCESS

    def nvmlDeviceGetP2PStatus(self, a: Any, b: Any, index: Any, out: Any) -> int:
        got = self._pair(a, b)
        if isinstance(got, int):
            return got
        v, _, _ = got
        i = index[0] if isinstance(index, tuple) else getattr(index, "value", index)
        _target(out).value = p2p_status(v.topology, int(i))
        return NVML_SUCCESS


def common_ancestor(topo: Topology | None) -> int:
    """NVML's nearest common ancestor of two GPUs of machine `topo`: one PCIe switch for
    peer-to-peer PCIe machines, the host bridge where traffic goes through host memory (and
    where nothing is modeled), the CPU's node for NVLink machines (their PCIe paths meet at it)."""
    if topo is None or not topo.p2p:
        return TOPOLOGY_HOSTBRIDGE
    return TOPOLOGY_NODE if topo.hw == "NVLink" else TOPOLOGY_SINGLE


def p2p_status(topo: Topology | None, caps_index: int) -> int:
    """NVML's P2P status between two GPUs of machine `topo` for a capability (read, write,
    NVLink, atomics, PCI): OK where the modeled machine has peer-to-peer (over NVLink for the
    NVLink capability), else "chipset not supported", as host-staged PCIe machines answer."""
    if topo is None or not topo.p2p:
        return P2P_CHIPSET_NOT_SUPPORTED
    if caps_index == P2P_CAPS_INDEX_NVLINK and topo.hw != "NVLink":
        return P2P_CHIPSET_NOT_SUPPORTED
    return P2P_OK


def nvlink_count(topo: Topology | None) -> int:
    """Links between two GPUs of machine `topo` (nvidia-smi topo -m's NV#), 0 without NVLink."""
    if topo is None or topo.hw != "NVLink":
        return 0
    per_link = 20.6 if topo.compute_capability == "9.0" else 20.0
    if topo.key == "nvlink4-bridge":
        return 12
    return max(1, round(topo.bus_gbs / per_link))
