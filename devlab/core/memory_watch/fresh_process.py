"""`run_fresh`: run a function in a new process with chosen simulated-GPU memory settings and
return its memory readings over time.

Memory settings (memory growth, a memory limit, the GPU model) are fixed once a runtime has
used its GPUs: a notebook that already did cannot try the other setting. A *spawned* process
starts with no runtime at all, so it can, and the notebook's own runtime stays untouched.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from devlab.core.memory_watch.readers import MemoryReading

__all__ = ["FreshRun", "run_fresh"]


@dataclass(frozen=True)
class FreshRun:
    """What `run_fresh` saw: the function's return `value` and each simulated GPU's readings
    (`series`, label -> readings in time order, as `Sampler.series()` returns), under the
    settings it ran with."""

    value: Any
    series: dict[str, list[MemoryReading]]
    model: str | None
    growth: bool
    memory_limit: int | None

    def _readings(self, gpu: int) -> list[MemoryReading]:
        labels = list(self.series)
        if not 0 <= gpu < len(labels):
            raise IndexError(f"gpu must be 0..{len(labels) - 1}, got {gpu}")
        return self.series[labels[gpu]]

    def peak_reserved(self, gpu: int = 0) -> int:
        """The most GPU `gpu`'s allocator held reserved at any reading (bytes)."""
        return max(r.reserved or 0 for r in self._readings(gpu))

    def peak_allocated(self, gpu: int = 0) -> int:
        """The most bytes of tensors GPU `gpu` held at any reading (its exact peak)."""
        return max(max(r.used, r.peak or 0) for r in self._readings(gpu))

    def limit(self, gpu: int = 0) -> int | None:
        """GPU `gpu`'s memory as the readings report it: its limit or its total (bytes)."""
        return self._readings(gpu)[-1].limit

    def plot(self, ax=None, title: str | None = None):
        """The readings as a `MemoryChart`'s matplotlib `Figure` (on `ax` if given)."""
        from devlab.core.memory_watch.memory_chart import MemoryChart

        if title is None:
            title = (f"{self.model or 'simulated GPU'}, memory growth "
                     f"{'on' if self.growth else 'off'}")
        chart = MemoryChart(ax=ax, title=title)
        chart.update(self.series, final=True)
        return chart.fig


def _check(fn: Any, gpus: Any, model: Any, growth: Any, memory_limit: Any, interval: Any,
           timeout: Any) -> str | None:
    if not callable(fn):
        raise TypeError(f"fn must be a function to run in the new process, got "
                        f"{type(fn).__name__}")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 8:
        raise ValueError(f"gpus must be a whole number of simulated GPUs from 1 to 8, got {gpus!r}")
    if not isinstance(growth, bool):
        raise TypeError(f"growth must be True (allocate as needed) or False (reserve most "
                        f"memory at first use), got {growth!r}")
    if memory_limit is not None and (isinstance(memory_limit, bool)
                                     or not isinstance(memory_limit, int) or memory_limit <= 0):
        raise ValueError(f"memory_limit must be a positive number of MB or None, got "
                         f"{memory_limit!r}")
    if not isinstance(interval, int | float) or not 0.001 <= interval <= 1.0:
        raise ValueError(f"interval must be seconds between readings, 0.001 to 1.0, got "
                         f"{interval!r}")
    if not isinstance(timeout, int | float) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if model is None:
        return None
    from devlab.engine import simulated

    return simulated.gpu_spec(model).name  # an unknown name fails here, naming the models


def run_fresh(fn: Callable[[], Any], *, model: str | None = "T4", growth: bool = True,
              memory_limit: int | None = None, gpus: int = 1, interval: float = 0.01,
              timeout: float = 120.0) -> FreshRun:
    """Run `fn()` in a new (spawned) process with `gpus` simulated GPUs of `model` ("T4", ...;
    None: unmodeled), memory growth on or off (`growth`) and `memory_limit` (MB, per GPU), and
    return its result and each GPU's memory readings, taken every `interval` seconds and
    just before and after `fn` (a `FreshRun`; `.plot()` draws them).

    This process, its torch and its devlab settings are left exactly as they were, so a
    notebook whose GPUs are already in use can still compare memory settings. `fn` is sent by
    value (cloudpickle): a function defined in a notebook cell works. It places its tensors
    on "cuda" as usual. An error in `fn` is raised here as RuntimeError with the new
    process's traceback; `timeout` (seconds) stops it with TimeoutError.
    """
    model = _check(fn, gpus, model, growth, memory_limit, interval, timeout)
    import cloudpickle

    try:
        payload = cloudpickle.dumps((fn, gpus, model, growth, memory_limit, interval))
    except Exception as e:
        raise TypeError(f"fn cannot be sent to a new process: {type(e).__name__}: {e}") from None
    # A plain interpreter rather than multiprocessing's spawn: spawn re-runs the caller's
    # __main__ script, and fn travels by value anyway. The child sees this process's sys.path.
    # No real GPU in the child: the simulation it runs refuses to sit beside one, and the
    # chart is of the modeled GPU wherever the notebook runs.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               CUDA_VISIBLE_DEVICES="")
    try:
        done = subprocess.run([sys.executable, "-c", "from devlab.core.memory_watch.fresh_process import _child; "
                               "_child()"], input=payload, capture_output=True, env=env,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"run_fresh: fn did not finish within {timeout} s; its process "
                           "was stopped") from None
    if done.stderr:
        sys.stderr.write(done.stderr.decode(errors="replace"))  # fn's prints and warnings
    try:
        kind, body = pickle.loads(done.stdout)
    except Exception:
        raise RuntimeError(f"run_fresh: the new process ended without an answer (exit code "
                           f"{done.returncode})") from None
    if kind == "error":
        raise RuntimeError(f"fn failed in the new process:\n{body}")
    value, series = cloudpickle.loads(body)
    return FreshRun(value, series, model, growth, memory_limit)


def _child() -> None:
    """The new process: set the GPUs up before any use, then sample while `fn` runs."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # fn's prints must not mix with the answer
    try:
        import cloudpickle

        fn, gpus, model, growth, memory_limit, interval = cloudpickle.loads(sys.stdin.buffer.read())
        from devlab.core import config
        from devlab.core.memory_watch.readers import SimulatedReader
        from devlab.core.memory_watch.sampler import Sampler

        config.simulate_gpus(gpus, memory_limit=memory_limit, model=model)
        for gpu in config.list_physical_devices("GPU"):
            config.set_memory_growth(gpu, growth)
        sampler = Sampler([SimulatedReader(i) for i in range(gpus)], interval=interval)
        with sampler:
            value = fn()
        answer = ("ok", cloudpickle.dumps((value, sampler.series())))
    except BaseException:  # noqa: BLE001 - every failure goes back to the caller as text
        answer = ("error", traceback.format_exc())
    out.write(pickle.dumps(answer))
    out.flush()
