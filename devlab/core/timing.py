"""Timing device work correctly, on the CPU, real GPUs and simulated GPUs.

Why not `%timeit`? On a GPU, a PyTorch call returns as soon as its kernels are *queued*;
the device works on after Python has moved on. `%timeit` stops its clock when the call
returns, so it measures the launch, not the work (a 4096x4096 matmul "takes" 20 µs), and
the queued work then lands in whatever is timed next. It also includes no warm-up (the
first calls pay for CUDA context start-up, allocator growth and kernel selection) and
reports a mean, which one slow outlier drags. `time_on_device`:

1. runs the function a few times first (warm-up); the first warm-up call runs under a light
   TorchFunctionMode that notes the device of every tensor it takes or makes, so timing knows
   where the work really runs. Work on other devices than the one named is refused
   (`DeviceMismatch`, naming both) rather than timed under the wrong name: in a comparison
   a relabelled row would compare a device with itself, and the mistake (tensors made
   elsewhere) is the very thing to learn. Work on the named device *and* others (two GPUs
   at once) is timed, and labelled with all of them;
2. synchronizes every device the call ran on before starting and before stopping each clock
   (real CUDA: `torch.cuda.synchronize`; simulated GPUs: the same call, which the simulation
   patches to wait for its worker; CPU: nothing to wait for), so no queued work is left
   behind, also when the call fails or is refused;
3. groups calls into blocks long enough for the clock to be exact, and repeats blocks until
   a minimum total time has passed;
4. reports the median per call and the spread (interquartile range), robust to outliers, and
   whether the measurement was steady (most blocks close to the fastest: see `STEADY`).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from devlab._helpers.figures import ensure_figure_formatter, figure_png
from devlab._helpers.tracebacks import drop_frames
from devlab.core import placement_scope as scope
from devlab.core.placement_scope import device_label
from devlab.engine import simulated

__all__ = [
    "STEADY",
    "DeviceMismatch",
    "TimingResult",
    "Comparison",
    "time_on_device",
    "compare",
    "synchronizer",
    "check_options",
    "clock_for",
    "format_seconds",
]

# One measured block should last at least this long: perf_counter and a synchronize cost
# about a microsecond, so a 1 ms block keeps their error under 0.1%.
_BLOCK_TIME = 1e-3

# A measurement is steady when its median block took at most this many times its fastest:
# at least half the blocks ran close to the machine's own speed. Load only ever adds time
# (a block that waited for the CPU is slower, never faster), so a median far above the
# fastest block means the machine was busy while measuring: on 2 busy cores a 2-thread
# 128x128 product's median block took 440x its fastest (benchmarks/timing.py prints the
# ratio for its workloads). Blocks of a quiet CPU agree within a few per cent.
STEADY = 1.5

# The most calls (or blocks) any option may ask for, and the longest least time to measure:
# beyond them a cell would run for hours, which is a mistake in the option, not a timing.
MAX_CALLS = 1_000_000
MAX_MIN_TIME = 3600.0


def format_seconds(t: float) -> str:
    """0.000123 -> '123 µs' (three significant digits, the unit that fits)."""
    if t is None or math.isnan(t):
        return "—"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if abs(t) >= scale or unit == "ns":
            return f"{t / scale:.3g} {unit}"
    raise AssertionError("unreachable")


def _unit_for(t: float) -> tuple[str, float]:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if t >= scale:
            return unit, scale
    return "ns", 1e-9


def check_options(
    *,
    warmup: int | None = None,
    repeats: int | None = None,
    min_time: float | None = None,
    max_repeats: int | None = None,
    number: int | None = None,
    flags: bool = False,
) -> None:
    """Raise a `ValueError` for the first timing option `time_on_device` cannot honour.

    Options left out (None) are not checked. The message names the option as the caller
    wrote it: `min_time`, or `--min-time` with `flags=True` (a magic's arguments).
    """
    def name(option: str) -> str:
        return "--" + option.replace("_", "-") if flags else option

    def whole(value: object) -> bool:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    # Upper bounds keep a timing a timing: a request that would run for days is a typo, and
    # is refused before the cell starts rather than left to hang it.
    wanted = (
        ("warmup", warmup, 0, MAX_CALLS, "untimed calls before measuring"),
        ("repeats", repeats, 1, MAX_CALLS, "blocks of calls to measure at least"),
        ("max_repeats", max_repeats, repeats or 1, MAX_CALLS,
         "blocks of calls to measure at most, no fewer than repeats"),
        ("number", number, 1, MAX_CALLS, "calls per block"),
    )
    for option, value, least, most, meaning in wanted:
        if value is not None and not (whole(value) and least <= value <= most):
            raise ValueError(
                f"{name(option)} is the number of {meaning}, a whole number from {least} to "
                f"{most:,}; got {value!r}."
            )
    if min_time is not None and not (
        isinstance(min_time, numbers.Real) and not isinstance(min_time, bool)
        and 0 <= min_time <= MAX_MIN_TIME
    ):
        raise ValueError(
            f"{name('min_time')} is the least time in seconds to measure for, from 0 to "
            f"{MAX_MIN_TIME:g} (an hour); got {min_time!r}."
        )


def synchronizer(device: torch.device) -> tuple[Callable[[], None], str]:
    """The call that waits for all queued work on `device`, and how to describe it."""
    if device.type == "cuda":
        # While a simulation runs, torch.cuda.synchronize is the simulation's: it waits for the
        # simulated GPU's worker. On real CUDA it waits for the device's streams.
        return (lambda: torch.cuda.synchronize(device)), "torch.cuda.synchronize"
    if device.type == "mps":
        return torch.mps.synchronize, "torch.mps.synchronize"
    if device.type == "cpu":
        return (lambda: None), "none needed (CPU work is done when the call returns)"
    accel = getattr(torch, "accelerator", None)
    if accel is not None and hasattr(accel, "synchronize"):
        return (lambda: accel.synchronize(device)), "torch.accelerator.synchronize"
    raise ValueError(f"do not know how to wait for a {device.type!r} device")


@contextlib.contextmanager
def _on_device(name: torch.device | str, device: torch.device) -> Iterator[None]:
    """Make `device` the default for the block with `devlab.device` (it knows TensorFlow
    names and soft placement).

    When `device` already is the default (the CPU, usually) nothing is entered: a device
    context is a TorchFunctionMode, which adds about a microsecond to every torch call and
    would be timed with the work.
    """
    if device == torch.get_default_device():
        yield
        return
    with scope.device(name if isinstance(name, str) else str(name)):
        yield


class DeviceMismatch(RuntimeError):
    """The timed work ran on other devices than the one it was timed on (its tensors live
    there). Raised after those devices were synchronized: nothing is left queued."""


_DisableTorchFunction = torch._C.DisableTorchFunction


class _DevicesSeen(TorchFunctionMode):
    """Notes the device of every tensor a torch call takes or makes: where the work ran.

    Watches one untimed call (the first warm-up call), so the timed ones pay nothing. Sees
    the Python-level calls, as the simulation and `torch.device` do; what C++ runs from them
    (a backward pass) runs where they ran. A 0-dim CPU tensor does not count: torch lets one
    join work on any device, as a Python number would; nor does a meta tensor, which has no
    data and runs nowhere.
    """

    def __init__(self) -> None:
        super().__init__()
        self.devices: set[torch.device] = set()

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        __tracebackhide__ = True  # noqa: F841 - an error in the work shows the work's frames
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        with _DisableTorchFunction():
            for value in (*args, *kwargs.values(), out):
                if isinstance(value, torch.Tensor):
                    self._note(value)
                elif isinstance(value, (list, tuple)):
                    for item in value:
                        if isinstance(item, torch.Tensor):
                            self._note(item)
        return out

    def _note(self, t: torch.Tensor) -> None:
        device = t.device  # the simulation's mark, for a simulated GPU's tensor
        if device.type == "meta" or (device.type == "cpu" and t.dim() == 0):
            return
        if device.index is None and device.type != "cpu":
            device = torch.device(device.type, 0)
        self.devices.add(device)


def _same(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def _sync_all(devices: Sequence[torch.device]) -> Callable[[], None]:
    """One call that waits for every device in `devices` (nothing for the CPU)."""
    calls = [synchronizer(d)[0] for d in devices if d.type != "cpu"]
    if not calls:
        return lambda: None
    if len(calls) == 1:
        return calls[0]

    def sync() -> None:
        for call in calls:
            call()

    return sync


def _short(device: torch.device) -> str:
    """`GPU:1`, `CPU:0`: a device's TensorFlow name without its kind."""
    return device_label(device).split(" (")[0]


def _mismatch(named: str, device: torch.device, ran: set[torch.device]) -> DeviceMismatch:
    """The error for work that ran elsewhere than `device` (whose short name is `named`)."""
    where = sorted(ran, key=str)
    if device.type == "cpu":
        make = "on the host (t.cpu() moves a tensor t made before)"
    else:
        make = (f"on {named}: in setup, or inside the timed code, where {named} is the default "
                f"device (t.to('{device}') moves a tensor t made before)")
    return DeviceMismatch(
        f"The timed work ran on {' and '.join(f'{_short(d)} ({d})' for d in where)}, not on "
        f"{named} ({device}), the device it was timed on: its tensors live there, so its time "
        f"would carry the wrong device's name. Time it on '/{_short(where[0])}', or make its "
        f"tensors {make}.")


def _drop_own_frames(err: BaseException) -> None:
    """A `DeviceMismatch` is the caller's mistake: its traceback ends at the caller's line,
    without this module's frames (a bare `raise` keeps the edited traceback on 3.11+)."""
    if not isinstance(err, DeviceMismatch):
        return
    drop_frames(err, lambda filename: filename == __file__)


def _check_where(named: str, device: torch.device, ran: set[torch.device]) -> None:
    """Refuse work that did not run on `device`; accept work on it (and on others too)."""
    gpus = {d for d in ran if d.type != "cpu"}
    if device.type == "cpu":
        if gpus:
            raise _mismatch(named, device, gpus)
    elif ran and not any(_same(d, device) for d in ran):
        raise _mismatch(named, device, ran)


@dataclass
class TimingResult:
    """Per-call times of one function on one device, with median and spread.

    `times` holds one value per measured block (seconds per call, the block's total divided
    by `number`, the calls per block).
    """

    label: str
    device: str
    times: list[float]
    number: int
    warmup: int
    synchronize: str
    name: str = ""
    simulated: bool = False
    modeled: str | None = None  # the real GPU whose specifications gave these times
    ran_on: tuple[str, ...] = ()  # the torch devices the work ran on (its first call's)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def q1(self) -> float:
        return _quantiles(self.times)[0]

    @property
    def q3(self) -> float:
        return _quantiles(self.times)[2]

    @property
    def iqr(self) -> float:
        """Interquartile range: the middle half of the measurements spans this much."""
        return self.q3 - self.q1

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def steady(self) -> bool:
        """Whether at least half the blocks ran close to the fastest (median within `STEADY`
        times the fastest block). A modeled clock gives every block the same time: steady."""
        return bool(self.modeled) or self.median <= STEADY * self.min

    @property
    def spread(self) -> str:
        """The IQR as shown: a modeled clock has none (its blocks differ only by rounding)."""
        if self.modeled:
            return "none (modeled: every block the same)"
        return format_seconds(self.iqr)

    @property
    def repeats(self) -> int:
        return len(self.times)

    @property
    def calls(self) -> int:
        return len(self.times) * self.number

    @property
    def total(self) -> float:
        """Seconds spent measuring (warm-up not included)."""
        return sum(self.times) * self.number

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "device": self.device, "median": self.median,
                "iqr": self.iqr, "q1": self.q1, "q3": self.q3, "min": self.min,
                "mean": self.mean, "repeats": self.repeats, "number": self.number,
                "warmup": self.warmup, "synchronize": self.synchronize,
                "steady": self.steady, "modeled": self.modeled, "ran_on": list(self.ran_on)}

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        if self.modeled:
            # One number: the modeled clock has no spread to show.
            return (f"{self.label}: {format_seconds(self.median)} per call, "
                    f"{self.repeats} x {self.number} calls [modeled from {self.modeled} "
                    "specifications, not measured: the same every run]")
        unsteady = "" if self.steady else " (unsteady: the machine was busy?)"
        return (f"{self.label}: {format_seconds(self.median)} per call (median), "
                f"IQR {format_seconds(self.iqr)}, {self.repeats} x {self.number} "
                f"calls{unsteady}")

    def _rows(self) -> list[tuple[str, str]]:
        if self.modeled:
            spread = [("spread", "none: the modeled clock gives every block the same time")]
        else:
            spread = [
                ("IQR (q1 – q3)", f"{format_seconds(self.iqr)} "
                                  f"({format_seconds(self.q1)} – {format_seconds(self.q3)})"),
                ("min / mean", f"{format_seconds(self.min)} / {format_seconds(self.mean)}"),
                ("steady", "yes" if self.steady else
                 f"no: the median block took {self.median / self.min:.2f}x the fastest "
                 "(the machine was busy?)"),
            ]
        return [
            ("device", f"{self.label} ({', '.join(self.ran_on) or self.device})"),
            ("median per call", format_seconds(self.median)),
            *spread,
            ("measured", f"{self.repeats} blocks x {self.number} calls, after {self.warmup} "
                         f"warm-up calls"),
            ("synchronize", self.synchronize),
        ] + ([("modeled", f"from {self.modeled} specifications, not measured")]
             if self.modeled else [])

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><th style='text-align:left'>{escape(k)}</th><td style='text-align:"
                       f"left'>{escape(v)}</td></tr>" for k, v in self._rows())
        return f"<table class='devlab-timing'>{rows}</table>"

    def plot(self, ax=None):
        """Each measurement per call, with the median and the interquartile band.

        Returns the matplotlib `Figure` (shown in a notebook when it is a cell's value).
        """
        fig, ax = _figure_and_axes(ax, (6, 2.6))
        unit, scale = _unit_for(self.median)
        ys = [t / scale for t in self.times]
        ax.plot(range(1, len(ys) + 1), ys, ".", color="C0", alpha=0.7, label="measurement")
        ax.axhline(self.median / scale, color="C1", label=f"median {format_seconds(self.median)}")
        ax.axhspan(self.q1 / scale, self.q3 / scale, color="C1", alpha=0.15, label="IQR")
        ax.set_xlabel(f"block ({self.number} call{'s' if self.number > 1 else ''} each)")
        ax.set_ylabel(f"time per call ({unit})")
        ax.set_title(f"{self.label}", fontsize=10)
        ax.legend(loc="upper right", fontsize=8)
        fig.tight_layout()
        return fig


def _quantiles(xs: Sequence[float]) -> tuple[float, float, float]:
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[1], q[2]


def _figure_and_axes(ax, size: tuple[float, float]):
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure

    # A bare Figure, not pyplot's: it is not shown a second time at the end of the cell, and
    # is safe to draw from a widget's thread.
    ensure_figure_formatter()
    fig = Figure(figsize=size, dpi=100)
    return fig, fig.add_subplot()


def time_on_device(
    fn: Callable[[], Any],
    device: torch.device | str = "cpu",
    *,
    warmup: int = 2,
    min_time: float = 0.2,
    repeats: int = 5,
    max_repeats: int = 10_000,
    number: int | None = None,
    label: str | None = None,
    setup: Callable[[], Any] | None = None,
    progress: Callable[[float], None] | None = None,
    as_default: bool = True,
) -> TimingResult:
    """Time `fn()` on `device`: warm-up, synchronize, repeat, median.

    `fn` is called with no arguments while `device` is the default device (factories such
    as `torch.ones` create tensors there). That device context is a TorchFunctionMode and
    adds about a microsecond to each torch call: for microsecond-scale work whose tensors
    already exist, `as_default=False` times it without (setup still runs under it).
    Measurement goes on until at least `repeats` blocks and `min_time` seconds have been
    measured (or `max_repeats` blocks). `number` is the calls per block, chosen so a block
    lasts about a millisecond when not given. `setup()`, if given, runs once on the device
    before the warm-up, untimed (making inputs). `progress(fraction)` is called now and then,
    for a progress bar.

    The first warm-up call (made even with `warmup=0`) finds the devices `fn` runs on: work
    that ran elsewhere than `device` raises `DeviceMismatch` naming both; work on `device`
    and other devices too is timed and labelled with all of them. Every one of them is
    synchronized before each clock starts and stops, and again if timing stops on an error.

    Unlike `%timeit`, the clock stops only once the devices have finished (see the module
    docstring), so GPU times are the device's real times. On a simulated GPU with a
    performance model (`simulate_gpus(2, model="T4")`) the clock is the modeled one: the times
    are modeled from that GPU's specifications, not measured, and the same on every run, so
    `min_time` does not apply, and two blocks that took the same time end the measurement.
    """
    __tracebackhide__ = True  # noqa: F841 - an error in fn shows fn's frames, not these
    check_options(warmup=warmup, repeats=repeats, min_time=min_time, max_repeats=max_repeats,
                  number=number)
    dev, short = _resolve(device)
    clock, spec = clock_for(dev)
    if spec is not None:
        min_time = 0.0
    waited: list[torch.device] = [] if dev.type == "cpu" else [dev]  # devices to synchronize
    set_up, seen = _DevicesSeen(), _DevicesSeen()
    times: list[float] = []
    try:
        if setup is not None:
            with _on_device(device, dev), set_up:
                setup()
            _add(waited, set_up.devices)
        # Host work is timed as plain PyTorch runs it, without the simulation's modes.
        with (simulated.host_only() if dev.type == "cpu" else contextlib.nullcontext()), \
                (_on_device(device, dev) if as_default else contextlib.nullcontext()):
            with seen:  # the first warm-up call: where does the work run?
                fn()
            ran = seen.devices
            _add(waited, ran)
            sync = _sync_all(waited)
            sync()
            _check_where(short, dev, ran)
            for _ in range(warmup - 1):
                fn()
            sync()
            if number is None:
                # One more warm-up call sizes the blocks; a quick one is tried thrice, so one
                # call that waited for the machine does not shrink every block to one call.
                one = math.inf
                for _ in range(3):
                    t0 = clock()
                    fn()
                    sync()
                    one = min(one, clock() - t0)
                    if one >= _BLOCK_TIME:
                        break
                number = max(1, min(int(_BLOCK_TIME / max(one, 1e-9)), 1_000_000))
            measured = 0.0
            last_report = clock()
            while len(times) < max_repeats and (len(times) < repeats or measured < min_time):
                sync()
                t0 = clock()
                for _ in range(number):
                    fn()
                sync()
                elapsed = clock() - t0
                times.append(elapsed / number)
                measured += elapsed
                if spec is not None and len(times) >= 2 and math.isclose(
                        times[-1], times[-2], rel_tol=1e-9, abs_tol=1e-15):
                    break  # a modeled clock: every further block would take the same time
                if progress is not None and clock() - last_report > 0.1:
                    last_report = clock()
                    progress(min(1.0, max(len(times) / repeats, measured / max(min_time, 1e-9))))
    except BaseException as e:
        # Whatever stopped the timing (an error in fn, a refusal, an interrupt), the work it
        # queued is finished now, not in whatever runs next. The error itself is what shows.
        _add(waited, set_up.devices | seen.devices)  # as far as they were seen
        with contextlib.suppress(Exception):
            _sync_all(waited)()
        _drop_own_frames(e)
        raise
    if progress is not None:
        progress(1.0)
    others = [d for d in waited if not _same(d, dev)]
    if label is None:
        label = device_label(dev, " + ".join([short, *(_short(d) for d in others)]))
    how = synchronizer(waited[0] if waited else dev)[1]
    if len(waited) > 1:
        how += " (" + ", ".join(str(d) for d in waited) + ")"
    return TimingResult(label, str(dev), times, number, max(warmup, 1), how,
                        device if isinstance(device, str) else str(device),
                        simulated=dev.type == "cuda" and simulated.is_active(),
                        modeled=spec.full_name if spec is not None else None,
                        ran_on=tuple(sorted(str(d) for d in ran)))


def _resolve(device: torch.device | str) -> tuple[torch.device, str]:
    """The torch device work named `device` runs on, and its short TensorFlow name (`GPU:1`:
    the logical device's own, which on a split real GPU is not the CUDA index's)."""
    if isinstance(device, torch.device):
        return device, _short(device)
    placement = scope.resolve(device)
    return placement.device, placement.logical.name.rsplit("device:", 1)[-1]


def _add(devices: list[torch.device], more: Iterable[torch.device]) -> None:
    """Add the non-CPU devices of `more` to `devices`, each once, in a stable order."""
    for d in sorted(more, key=str):
        if d.type != "cpu" and not any(_same(d, have) for have in devices):
            devices.append(d)


def clock_for(device: torch.device) -> tuple[Callable[[], float], Any]:
    """The clock that times work on `device`, and the GPU spec when it is a modeled one."""
    if device.type == "cuda" and simulated.is_active():
        spec = simulated.model()
        if spec is not None:
            return simulated.modeled_time, spec
    return time.perf_counter, None


@dataclass
class Comparison:
    """Timings of the same work on several devices; speed-ups are against the first."""

    results: list[TimingResult] = field(default_factory=list)

    def add(self, result: TimingResult) -> TimingResult:
        """Append a result; a label already taken gets a number (`CPU:0 #2`)."""
        taken = {r.label for r in self.results}
        if result.label in taken:
            k = 2
            while f"{result.label} #{k}" in taken:
                k += 1
            result.label = f"{result.label} #{k}"
        self.results.append(result)
        return result

    @property
    def baseline(self) -> TimingResult:
        return self.results[0]

    @property
    def speedups(self) -> dict[str, float]:
        """label -> how many times faster than the first device (median over median)."""
        base = self.baseline.median
        return {r.label: base / r.median for r in self.results}

    def __getitem__(self, label: str) -> TimingResult:
        for r in self.results:
            if r.label == label or r.name == label or r.device == label:
                return r
        raise KeyError(label)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        speedups = self.speedups
        return {r.label: {**r.to_dict(), "speedup": speedups[r.label]} for r in self.results}

    @property
    def note(self) -> str | None:
        """What a reader must know to read these times: which devices were simulated, and
        which times are modeled rather than measured."""
        modeled = [r for r in self.results if r.modeled]
        if modeled:
            gpus = sorted({r.modeled for r in modeled if r.modeled})
            measured = [r.label for r in self.results if not r.modeled]
            return (f"Times on {', '.join(r.label for r in modeled)} are modeled from "
                    f"{', '.join(gpus)} specifications, not measured"
                    + (f"; {', '.join(measured)} measured on this machine." if measured else "."))
        if not any(r.simulated for r in self.results):
            return None
        return ("Simulated GPUs are CPU-backed: their times measure this machine's CPU, "
                "and say nothing about a real GPU.")

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        speedups = self.speedups
        lines = [f"{r} — {speedups[r.label]:.2f}x vs {self.baseline.label}" for r in self.results]
        return "\n".join(lines + ([self.note] if self.note else []))

    def _repr_html_(self) -> str:
        speedups = self.speedups
        head = "".join(f"<th>{h}</th>" for h in (
            "device", "median per call", "IQR", "calls", f"speed-up vs {self.baseline.label}"))
        rows = "".join(
            "<tr>" + "".join(f"<td>{escape(v)}</td>" for v in (
                r.label, format_seconds(r.median), r.spread,
                f"{r.repeats} x {r.number}", f"{speedups[r.label]:.2f}x")) + "</tr>"
            for r in self.results)
        note = f"<p class='devlab-note'><i>{escape(self.note)}</i></p>" if self.note else ""
        return (f"<table class='devlab-comparison'><thead><tr>{head}</tr></thead>"
                f"<tbody>{rows}</tbody></table>{note}")

    def plot(self, ax=None):
        """A bar per device (median per call, IQR as error bars), labelled with speed-ups."""
        fig, ax = _figure_and_axes(ax, (6, 0.6 + 0.55 * max(2, len(self.results))))
        if not self.results:
            return fig
        unit, scale = _unit_for(max(r.median for r in self.results))
        labels = [r.label for r in self.results]
        medians = [r.median / scale for r in self.results]
        # Error bars from the median to q1 and q3: asymmetric, as the spread usually is.
        err = [[(r.median - r.q1) / scale for r in self.results],
               [(r.q3 - r.median) / scale for r in self.results]]
        ys = list(range(len(labels)))
        ax.barh(ys, medians, xerr=err, color=[f"C{i}" for i in ys], alpha=0.85, capsize=3)
        ax.set_yticks(ys, labels)
        ax.invert_yaxis()
        ax.set_xlabel(f"median time per call ({unit})")
        speedups = self.speedups
        right = [max(r.q3, r.median) / scale for r in self.results]  # past the error bar
        for y, r, x in zip(ys, self.results, right, strict=True):
            ax.text(x, y, f"  {speedups[r.label]:.2f}x", va="center", fontsize=9)
        ax.set_xlim(0, max(right) * 1.25)
        ax.set_title(f"speed-up vs {self.baseline.label}", fontsize=10)
        fig.tight_layout()
        return fig

    def png(self) -> bytes:
        return figure_png(self.plot())


def compare(
    fn: Callable[[], Any] | Mapping[Any, Callable[[], Any]],
    devices: Iterable[torch.device | str] | None = None,
    *,
    on_result: Callable[[TimingResult], None] | None = None,
    **timing: Any,
) -> Comparison:
    """Time the same work on several devices; the first is the baseline of the speed-ups.

    `fn` is one callable run on each of `devices` (with that device as the default device),
    or a mapping `{device: callable}` when each device needs its own inputs. Keyword
    arguments go to `time_on_device`. `on_result` is called as each device finishes.
    """
    __tracebackhide__ = True  # noqa: F841
    if isinstance(fn, Mapping):
        if devices is not None:
            raise TypeError("pass either a {device: fn} mapping or fn and devices, not both")
        pairs = list(fn.items())
    else:
        if devices is None:
            raise TypeError("compare(fn, devices): which devices?")
        pairs = [(d, fn) for d in devices]
    if not pairs:
        raise ValueError("no devices to compare")
    comparison = Comparison()
    for device, f in pairs:
        try:
            result = comparison.add(time_on_device(f, device, **timing))
        except DeviceMismatch as e:
            _drop_own_frames(e)
            raise
        if on_result is not None:
            on_result(result)
    return comparison
