"""`nvidia-smi` for the simulated GPUs: the board table, `--query-gpu`, `--query-compute-apps`,
`-L`, `topo -m` and `-i`, printed from NVML's answers (`nvml_answers.View`) under a banner that
says the GPUs are simulated. Formatting is a pure function of the view.

While GPUs are simulated, a private folder holding an `nvidia-smi` launcher (a small `sh`
script) and the machine's description stands first on the process's PATH, which children
inherit (`!nvidia-smi`, `subprocess.run(["nvidia-smi"])`). The launcher runs this module with
stubbed parent packages (`launcher_script`), so it imports neither devlab's package nor torch,
and reads every process's memory from the machine's register (`base.machine`). Where a real
`nvidia-smi` further along the PATH lists GPUs, that one runs instead.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable

from devlab.engine.simulated.base import machine
from devlab.engine.simulated.instruments import nvml_answers as nv

WIDTH = 89  # between the outer bars of the real table (driver 550's layout)
_MIB = 1024 * 1024
NA = "[N/A]"
SHIM_MARK = "# devlab: nvidia-smi for the simulated GPUs"  # the launcher's second line


def banner(view: nv.View) -> str:
    d = view.description
    model = (f"modeled on NVIDIA {d.model} specifications (times modeled, not measured)"
             if d.model else "no GPU model: memory only")
    return (f"devlab: {len(view.boards)} simulated GPU{'s' if len(view.boards) != 1 else ''} "
            f"(CPU-backed; {model}). Memory is what this machine's simulated processes hold; "
            "temperature and power draw are not modeled (N/A).")


def _mib(n: int) -> int:
    return n // _MIB


def table(view: nv.View, gpus: list[int] | None = None, now: str | None = None) -> str:
    """The default `nvidia-smi` output for GPUs `gpus` (all if None)."""
    chosen = [view.boards[i] for i in (gpus if gpus is not None else range(len(view.boards)))]
    rule = "+" + "-" * WIDTH + "+"
    mid = "|" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    bottom = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    cuda = f"{nv.CUDA_DRIVER_VERSION // 1000}.{nv.CUDA_DRIVER_VERSION % 1000 // 10}"
    head = (f" NVIDIA-SMI {nv.DRIVER_VERSION:<22} Driver Version: {nv.DRIVER_VERSION:<14} "
            f"CUDA Version: {cuda:<8}")
    lines = [banner(view), f"{now or time.ctime()}       ", rule, "|" + head.ljust(WIDTH) + "|",
             mid,
             "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | "
             "Volatile Uncorr. ECC |",
             "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | "
             "GPU-Util  Compute M. |",
             "|                                         |                        |"
             "               MIG M. |",
             "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|"]
    for b in chosen:
        cap = f"{b.power_limit_w:.0f}W" if b.power_limit_w is not None else "N/A"
        util = view.utilization[b.index]
        lines += [
            f"| {b.index:>3}  {b.name[:30]:<30}{'Off':>4} |{b.pci_bus_id:>19} {'Off':>3} |"
            f"{'N/A':>21} |",
            f"| {'N/A':>3}   {'N/A':>3}    {'P0':>2}{'N/A':>16} / {cap:>5} |"
            f"{str(_mib(view.used(b.index))) + 'MiB':>11} / {str(_mib(b.total)) + 'MiB':>9} |"
            f"{(str(util) + '%') if util is not None else 'N/A':>8}{'Default':>13} |",
            "|" + " " * 41 + "|" + " " * 24 + "|" + f"{'N/A':>21} |",
            bottom]
    lines += [" " * WIDTH, rule, "|" + " Processes:".ljust(WIDTH) + "|",
              "|" + "  GPU   GI   CI        PID   Type   Process name".ljust(WIDTH - 11)
              + "GPU Memory |",
              "|" + "        ID   ID".ljust(WIDTH - 11) + "Usage      |",
              "|" + "=" * WIDTH + "|"]
    rows = [(b.index, p) for b in chosen for p in view.on_gpu(b.index)]
    if not rows:
        lines.append("|" + "  No running processes found".ljust(WIDTH) + "|")
    for index, p in rows:
        mem = f"{_mib(p.used[index])}MiB"
        left = f"  {index:>3}   {'N/A':>3}  {'N/A':>3}  {p.pid:>9}  {'C':>5}   "
        room = WIDTH - len(left) - len(mem) - 2
        name = p.name if len(p.name) <= room else "..." + p.name[-(room - 3):]
        lines.append("|" + left + name.ljust(room) + " " + mem + " |")
    lines.append(rule)
    return "\n".join(lines) + "\n"


def listing(view: nv.View, gpus: list[int] | None = None) -> str:
    """`nvidia-smi -L`."""
    chosen = [view.boards[i] for i in (gpus if gpus is not None else range(len(view.boards)))]
    return "".join(f"GPU {b.index}: {b.name} (UUID: {b.uuid})\n" for b in chosen)


def _topo_cell(view: nv.View) -> str:
    t = view.topology
    links = nv.nvlink_count(t)
    if links:
        return f"NV{links}"
    return "PIX" if t is not None and t.p2p else "PHB"


def topo_matrix(view: nv.View) -> str:
    """`nvidia-smi topo -m`: how each pair of GPUs is joined, in the modeled machine."""
    n = len(view.boards)
    cpus = os.cpu_count() or 1
    cell = _topo_cell(view)
    head = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    rows = [f"GPU{i}\t" + "\t".join(" X " if i == j else cell for j in range(n))
            + f"\t0-{cpus - 1}\t0\t\tN/A" for i in range(n)]
    legend = ["", "Legend:", "",
              "  X    = Self",
              "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA "
              "nodes (e.g., QPI/UPI)",
              "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host "
              "Bridges within a NUMA node",
              "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
              "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe "
              "Host Bridge)",
              "  PIX  = Connection traversing at most a single PCIe bridge",
              "  NV#  = Connection traversing a bonded set of # NVLinks", "",
              f"devlab: the modeled machine is {view.topology.name if view.topology else 'not modeled'}"
              " (simulated GPUs)."]
    return "\n".join([head, *rows, *legend]) + "\n"


# --------------------------------------------------------------------------------------------
# --query-gpu and --query-compute-apps


def _value(unit: str | None, value: object) -> tuple[str, str | None]:
    return (str(value), unit) if value is not None else (NA, None)


def _gpu_fields(view: nv.View) -> dict[str, tuple[str | None, Callable[[nv.Board], object]]]:
    """Each --query-gpu field: its unit (None: none) and its value on a board (None: N/A)."""
    def clock(b: nv.Board) -> object:
        return b.max_graphics_mhz

    return {
        "index": (None, lambda b: b.index),
        "count": (None, lambda b: len(view.boards)),
        "name": (None, lambda b: b.name),
        "gpu_name": (None, lambda b: b.name),
        "uuid": (None, lambda b: b.uuid),
        "gpu_uuid": (None, lambda b: b.uuid),
        "pci.bus_id": (None, lambda b: b.pci_bus_id),
        "gpu_bus_id": (None, lambda b: b.pci_bus_id),
        "driver_version": (None, lambda b: nv.DRIVER_VERSION),
        "memory.total": ("MiB", lambda b: _mib(b.total)),
        "memory.used": ("MiB", lambda b: _mib(view.used(b.index))),
        "memory.free": ("MiB", lambda b: _mib(view.free(b.index))),
        "memory.reserved": ("MiB", lambda b: _mib(b.reserved)),
        "utilization.gpu": ("%", lambda b: view.utilization[b.index]),
        "utilization.memory": ("%", lambda b: view.utilization[b.index]),
        "compute_cap": (None, lambda b: (f"{b.compute_capability[0]}.{b.compute_capability[1]}"
                                         if b.compute_capability else None)),
        "clocks.gr": ("MHz", clock), "clocks.current.graphics": ("MHz", clock),
        "clocks.sm": ("MHz", clock), "clocks.current.sm": ("MHz", clock),
        "clocks.max.gr": ("MHz", clock), "clocks.max.graphics": ("MHz", clock),
        "clocks.max.sm": ("MHz", clock),
        "clocks.mem": ("MHz", lambda b: b.max_memory_mhz),
        "clocks.current.memory": ("MHz", lambda b: b.max_memory_mhz),
        "clocks.max.mem": ("MHz", lambda b: b.max_memory_mhz),
        "clocks.max.memory": ("MHz", lambda b: b.max_memory_mhz),
        "power.limit": ("W", lambda b: (f"{b.power_limit_w:.2f}"
                                        if b.power_limit_w is not None else None)),
        "power.default_limit": ("W", lambda b: (f"{b.power_limit_w:.2f}"
                                                if b.power_limit_w is not None else None)),
        "power.draw": ("W", lambda b: None),
        "temperature.gpu": (None, lambda b: None),
        "fan.speed": ("%", lambda b: None),
        "pstate": (None, lambda b: "P0"),
        "persistence_mode": (None, lambda b: "Disabled"),
        "compute_mode": (None, lambda b: "Default"),
        "pcie.link.gen.current": (None, lambda b: b.pcie_gen),
        "pcie.link.gen.max": (None, lambda b: b.pcie_gen),
        "pcie.link.width.current": (None, lambda b: 16 if b.pcie_gen else None),
        "pcie.link.width.max": (None, lambda b: 16 if b.pcie_gen else None),
    }


APP_FIELDS = ("pid", "process_name", "name", "used_memory", "used_gpu_memory", "gpu_uuid",
              "gpu_bus_id", "gpu_name")


class UsageError(ValueError):
    """A command line this nvidia-smi does not take (the message says what it does take)."""


def _format(spec: str) -> tuple[bool, bool]:
    """(header, units) of a --format value: csv[,noheader][,nounits]."""
    parts = [p.strip() for p in spec.split(",")]
    if not parts or parts[0] != "csv" or any(p not in ("noheader", "nounits") for p in parts[1:]):
        raise UsageError(f"--format={spec!r} is not a format: use csv, optionally with "
                         "noheader and nounits (--format=csv,noheader,nounits).")
    return "noheader" not in parts, "nounits" not in parts


def _csv(header: list[str], rows: list[list[tuple[str, str | None]]], show_header: bool,
         units: bool) -> str:
    out = [", ".join(header)] if show_header else []
    for row in rows:
        out.append(", ".join(v if not units or unit is None else f"{v} {unit}"
                             for v, unit in row))
    return "\n".join(out) + "\n"


def query_gpu(view: nv.View, fields: list[str], fmt: str, gpus: list[int] | None = None) -> str:
    """`nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`."""
    known = _gpu_fields(view)
    bad = [f for f in fields if f not in known]
    if bad or not fields:
        raise UsageError(f"Field \"{bad[0] if bad else ''}\" is not a valid field to query. "
                         f"This simulated nvidia-smi answers: {', '.join(known)}.")
    show_header, units = _format(fmt)
    header = [f if known[f][0] is None else f"{f} [{known[f][0]}]" for f in fields]
    chosen = [view.boards[i] for i in (gpus if gpus is not None else range(len(view.boards)))]
    rows = [[_value(known[f][0], known[f][1](b)) for f in fields] for b in chosen]
    return _csv(header, rows, show_header, units)


def query_apps(view: nv.View, fields: list[str], fmt: str, gpus: list[int] | None = None) -> str:
    """`nvidia-smi --query-compute-apps=pid,used_memory --format=csv...`."""
    bad = [f for f in fields if f not in APP_FIELDS]
    if bad or not fields:
        raise UsageError(f"Field \"{bad[0] if bad else ''}\" is not a valid field to query. "
                         f"This simulated nvidia-smi answers: {', '.join(APP_FIELDS)}.")
    show_header, units = _format(fmt)
    names = {"name": "process_name", "used_memory": "used_gpu_memory"}
    header = [names.get(f, f) + (" [MiB]" if f in ("used_memory", "used_gpu_memory") else "")
              for f in fields]
    rows = []
    for b in (view.boards[i] for i in (gpus if gpus is not None else range(len(view.boards)))):
        for p in view.on_gpu(b.index):
            value = {"pid": (str(p.pid), None), "process_name": (p.name, None),
                     "name": (p.name, None), "used_memory": (str(_mib(p.used[b.index])), "MiB"),
                     "used_gpu_memory": (str(_mib(p.used[b.index])), "MiB"),
                     "gpu_uuid": (b.uuid, None), "gpu_bus_id": (b.pci_bus_id, None),
                     "gpu_name": (b.name, None)}
            rows.append([value[f] for f in fields])
    return _csv(header, rows, show_header, units)


USAGE = """nvidia-smi (devlab: the GPUs are simulated). Supported here:
  nvidia-smi                          the board table and its processes
  nvidia-smi -L, --list-gpus          one line per GPU, with its UUID
  nvidia-smi -i, --id=N[,M]           only these GPUs (with any of the others)
  nvidia-smi --query-gpu=F,... --format=csv[,noheader][,nounits]
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv[,...]
  nvidia-smi topo -m                  how the GPUs are joined
  nvidia-smi -h, --help               this text
"""


def run(argv: list[str], view: nv.View) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `nvidia-smi argv` on `view` (pure)."""
    try:
        return 0, _run(list(argv), view), ""
    except UsageError as e:
        return 2, "", f"{e}\n\n{USAGE}"


def _take(args: list[str], i: int, flag: str) -> tuple[str, int]:
    a = args[i]
    if "=" in a:
        return a.split("=", 1)[1], i + 1
    if i + 1 >= len(args):
        raise UsageError(f"{flag} needs a value.")
    return args[i + 1], i + 2


def _run(args: list[str], view: nv.View) -> str:
    if args[:1] == ["topo"]:
        if args[1:] not in (["-m"], ["--matrix"]):
            raise UsageError(f"nvidia-smi topo {' '.join(args[1:])!s}: only 'topo -m' is "
                             "supported here.")
        return topo_matrix(view)
    gpus: list[int] | None = None
    mode, fields, fmt = "table", [], None
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-h", "--help"):
            return USAGE
        if a in ("-L", "--list-gpus"):
            mode, i = "list", i + 1
        elif a == "-i" or a.startswith(("--id=", "-i=")) or a == "--id":
            value, i = _take(args, i, "-i")
            try:
                gpus = [int(x) for x in value.split(",")]
            except ValueError:
                raise UsageError(f"-i {value}: give GPU indices, e.g. -i 0 or -i 0,1.") from None
            missing = [g for g in gpus if not 0 <= g < len(view.boards)]
            if missing:
                raise UsageError(f"No devices were found with -i {value}: the GPUs are 0 to "
                                 f"{len(view.boards) - 1}.")
        elif a.startswith("--query-gpu") or a.startswith("--query-compute-apps"):
            value, i = _take(args, i, a.split("=")[0])
            mode = "gpu" if a.startswith("--query-gpu") else "apps"
            fields = [f.strip() for f in value.split(",") if f.strip()]
        elif a.startswith("--format"):
            fmt, i = _take(args, i, "--format")
        else:
            raise UsageError(f"nvidia-smi: unknown option {a!r} (this simulated nvidia-smi "
                             "takes the options below).")
    if mode in ("gpu", "apps"):
        if fmt is None:
            raise UsageError("--query-gpu and --query-compute-apps need --format=csv.")
        return (query_gpu if mode == "gpu" else query_apps)(view, fields, fmt, gpus)
    if fmt is not None:
        raise UsageError("--format goes with --query-gpu or --query-compute-apps.")
    return listing(view, gpus) if mode == "list" else table(view, gpus)


# --------------------------------------------------------------------------------------------
# The launcher


LAUNCHER = "nvidia-smi"
MACHINE_FILE = "machine.json"


def _packages() -> dict[str, list[str]]:
    """Every package above the modules this one imports (and itself), with its folders: what
    the launcher stubs. Read from the modules themselves, so a package that moves or is
    installed elsewhere is found where it is."""
    from devlab.engine.gpu_model import capacity, links, specs

    found: dict[str, list[str]] = {}
    for module in (sys.modules[__name__], nv, machine, capacity, links, specs):
        parts = module.__spec__.name.split(".")[:-1]
        for n in range(1, len(parts) + 1):
            name = ".".join(parts[:n])
            found.setdefault(name, list(sys.modules[name].__path__))
    return found


def launcher_script(python: str, machine_file: str) -> str:
    """The `sh` script that runs this module without importing devlab's package (or torch):
    its parent packages are stubbed as namespaces over their folders. `-S`: it needs only the
    standard library, so site-packages' start-up hooks (devlab's own, a sitecustomize) do not
    run in it, and libraries that call nvidia-smi in a loop (accelerate) do not pay for them."""
    boot = ("import sys,types\n"
            f"for n,p in {sorted(_packages().items())!r}:\n"
            "    m=types.ModuleType(n); m.__path__=p; sys.modules[n]=m\n"
            f"from {__spec__.name} import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    return (f"#!/bin/sh\n{SHIM_MARK} (removed when they stop)\n"
            f"exec {shlex.quote(python)} -S -c {shlex.quote(boot)} {shlex.quote(machine_file)} "
            '"$@"\n')


def _is_shim(path: str) -> bool:
    """Whether `path` is a devlab launcher (this process's or another simulating process's)."""
    try:
        with open(path, "rb") as f:
            return SHIM_MARK.encode() in f.read(256)
    except OSError:
        return False


def _real_nvidia_smi() -> str | None:
    """A real nvidia-smi on the PATH that lists GPUs, if there is one.

    See Note [Launchers of nested simulations]."""
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not folder:
            continue
        candidate = os.path.join(folder, "nvidia-smi")
        if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
            continue
        if _is_shim(candidate):
            continue
        try:
            out = subprocess.run([candidate, "-L"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return candidate if out.returncode == 0 and out.stdout.startswith("GPU ") else None
    return None


# Note [Launchers of nested simulations]
# A simulating process's children that simulate too (a rank a kernel forks, a program a
# simulating program starts) put their own launcher's folder first on the PATH they inherited,
# so the PATH holds several launchers. Each launcher looks for a real nvidia-smi to run
# instead; had it taken every other launcher for a real one, two launchers would probe each
# other with `-L` without end (each probe a process, orphaned at the 10 s timeout), and every
# call of accelerate's, which asks nvidia-smi before each launch, took over 10 s. Every
# launcher is marked (`SHIM_MARK`) and no launcher is ever probed.


def main(argv: list[str]) -> int:
    """The launcher's entry: argv[0] is the machine's description file, the rest nvidia-smi's
    own arguments."""
    machine_file, args = argv[0], argv[1:]
    real = _real_nvidia_smi()
    if real is not None:
        os.execv(real, [real, *args])
    with open(machine_file, encoding="utf-8") as f:
        description = nv.Description.from_json(f.read())
    view = nv.view_from(description, machine.entries(description.key))
    status, out, err = run(args, view)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return status
