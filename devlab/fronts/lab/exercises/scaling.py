"""Exercise 4 (d2l "GPUs"): two matrix products on two GPUs at the same time vs one after
the other on one GPU, and the speed-up against the ideal 2x.

What overlap there is comes from asynchronous launch: a call on a GPU returns once its work
is queued, so the host can queue the second product on the other GPU while the first runs.
The exercise measures whether launch really returned early, so a ~1x result can say why.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from devlab._helpers.host import cpu_cores
from devlab.core import config, d2l
from devlab.core.timing import STEADY, check_options, clock_for, synchronizer, time_on_device
from devlab.engine import simulated as sim
from devlab.fronts.lab.exercises._common import (
    RETRIES,
    ExerciseResult,
    Progress,
    busy_note,
    check_positive,
    device_info,
    format_seconds,
    load_average,
)

IDEAL = 2.0


class NeedsTwoGPUs(RuntimeError):
    """Raised when the two-GPU exercise runs on a machine with fewer than two GPUs."""


class ScalingResult(ExerciseResult):
    """Times of one product, two in sequence on one GPU, two at once on two GPUs."""

    def _draw(self, fig: Any) -> None:
        d = self.data
        ax = fig.add_subplot()
        g0, g1 = (dev["name"] for dev in d["devices"])
        labels = [f"1 product\n{g0}", f"2 products\n{g0}, in turn", f"2 products\n{g0} + {g1}"]
        times = [d["one_product"] * 1e3, d["sequential"] * 1e3, d["parallel"] * 1e3]
        ax.bar(range(3), times, color=["C7", "C0", "C2"])
        ax.set_xticks(range(3), labels, fontsize=8)
        ax.axhline(d["sequential"] / IDEAL * 1e3, color="gray", linestyle="--",
                   label=f"ideal 2x: {format_seconds(d['sequential'] / IDEAL)}")
        for x, t in enumerate(times):
            ax.text(x, t, f"{t:.3g} ms", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("median time (ms)")
        ax.set_title(f"two GPUs: {d['speedup']:.2f}x speed-up (ideal 2x)", fontsize=10)
        ax.legend(fontsize=8)


def _launch_check(a: torch.Tensor, b: torch.Tensor, device: torch.device, tries: int = 3
                  ) -> tuple[float, float]:
    """Median (time for `a @ b` to return, time until the device finished it), on the
    device's clock (the modeled one for a modeled GPU)."""
    sync, _ = synchronizer(device)
    clock = clock_for(device)[0]
    launches, totals = [], []
    for _ in range(tries):
        sync()
        t0 = clock()
        y = a @ b
        t1 = clock()
        sync()
        t2 = clock()
        launches.append(t1 - t0)
        totals.append(t2 - t0)
        del y
    return statistics.median(launches), statistics.median(totals)


def _explain(speedup: float, asynchronous: bool, simulated: bool, cores: int,
             load: float | None, modeled: str | None = None, bound: str | None = None,
             steady: bool = True, split: str | None = None) -> list[str]:
    """Why the speed-up is what it is, from what was measured and what the machine is; only
    that it is too noisy to call when the runs it comes from were not steady.

    `split` names the physical GPU both logical GPUs are made of, if they share one."""
    if not steady:
        out = [f"{speedup:.2f}x, but too noisy to call: the runs it comes from spread over more "
               f"than {STEADY:g}x their fastest even after {RETRIES} more tries (a busy "
               "machine?). Run it again on a quieter machine, or with more repeats."]
        if simulated:
            out.append(f"Simulated GPUs are CPU-backed: this measures how well {cores} CPU "
                       f"core{'s' if cores != 1 else ''} run two products at once, not how two "
                       "real GPUs would scale.")
        return out
    if speedup >= 1.6:
        out = [f"{speedup:.2f}x of the ideal 2x: the two devices worked at the same time."]
    elif speedup >= 1.15:
        out = [f"{speedup:.2f}x of the ideal 2x: the two devices overlapped only partly."]
    else:
        out = [f"{speedup:.2f}x of the ideal 2x: no real speed-up; the two products did not "
               "run at the same time."]
    if split is not None:
        out.append(f"Both are logical devices of one physical GPU ({split}), as the TensorFlow "
                   "guide splits one GPU to run multi-GPU code: they share its compute and its "
                   "one queue, so two products on them run one after the other. A split GPU "
                   "does not scale; only a second physical GPU adds compute.")
        if modeled is not None:
            out.append(f"Modeled from {modeled} specifications, not measured.")
        elif simulated:
            out.append(f"Without a timing model, simulated GPUs compute on this machine's "
                       f"{cores} CPU core{'s' if cores != 1 else ''}: this measures the CPU.")
        return out
    if modeled is not None:
        why = {"compute-bound": "each product is compute-bound: it keeps its GPU busy far "
                                "longer than the host takes to launch both, so the two queues "
                                "run side by side",
               "launch-bound": "each product is launch-bound: the host spends as long launching "
                               "as a GPU spends computing, so the host, not the GPUs, sets the "
                               "pace and a second GPU has little to add",
               "memory-bound": "each product is memory-bound, and each GPU has its own memory, "
                               "so the two queues run side by side"}.get(bound or "", "")
        out.append(f"Modeled from {modeled} specifications, not measured: two GPUs, two queues; "
                   f"{why}.")
        return out
    if not asynchronous:
        out.append("A product's call returned only once its work was done (launch was not "
                   "asynchronous), so the host could not queue the second device's product "
                   "until the first had finished: the two cannot overlap.")
    elif speedup < 1.6:
        out.append("Launch was asynchronous (both products were queued before either "
                   "finished), so what held the overlap back is the compute behind the two "
                   "devices.")
        if simulated:
            busy = "" if load is None else f" (1-minute load average {load:.1f}, this run included)"
            out.append(f"Both simulated GPUs compute on this machine's {cores} CPU "
                       f"core{'s' if cores != 1 else ''}{busy}, so they run at full speed "
                       "together only when two cores are free for them.")
    if simulated:
        out.append(f"Simulated GPUs are CPU-backed: this measures how well {cores} CPU "
                   f"core{'s' if cores != 1 else ''} run two products at once, not how two "
                   "real GPUs would scale.")
    return out


def two_gpu_scaling(
    size: int = 1024,
    repeats: int = 5,
    *,
    min_time: float = 0.2,
    warmup: int = 1,
    progress: bool | None = None,
) -> ScalingResult:
    """Time two `size` x `size` products on GPU 0 and GPU 1 at once against both on GPU 0
    in turn (each call waits for its devices), and give the speed-up against the ideal 2x.

    Needs two GPUs (real, or simulated with `devlab.config.simulate_gpus(2)`); with fewer it
    raises `NeedsTwoGPUs` saying so. Two logical GPUs of one physical GPU
    (`set_logical_device_configuration`) count: the result then says why a split GPU does
    not scale.
    """
    check_positive(size=size)
    check_options(min_time=min_time, repeats=repeats, warmup=warmup)
    have = d2l.num_gpus()
    if have < 2:
        raise NeedsTwoGPUs(
            f"two_gpu_scaling needs 2 GPUs; this machine has {have}. To run it on simulated "
            "(CPU-backed) GPUs, call devlab.config.simulate_gpus(2) before placing any work "
            "(at the top of the notebook; restart the kernel first if work was placed), or "
            "set DEVLAB_SIMULATE_GPUS=2."
        )
    infos = [device_info(d2l.gpu(0)), device_info(d2l.gpu(1))]
    g0, g1 = (i.torch_device for i in infos)
    # Two logical GPUs of one physical GPU (on a real GPU both are the same CUDA device): the
    # exercise still runs, and says why a split GPU does not scale.
    first, second = config.logical_devices("GPU")[:2]
    split = first.physical.name if first.physical == second.physical else None
    sync0, _ = synchronizer(g0)
    sync1, _ = synchronizer(g1)
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    a0, b0 = a.to(g0), b.to(g0)
    a1, b1 = a.to(g1), b.to(g1)

    def one() -> None:
        a0 @ b0
        sync0()

    def sequential() -> None:
        a0 @ b0
        a0 @ b0
        sync0()

    def parallel() -> None:
        # Both are queued before either is waited for: the GPUs can work at the same time.
        a0 @ b0
        a1 @ b1
        sync0()
        sync1()

    timing = {"warmup": warmup, "repeats": repeats, "min_time": min_time, "number": 1}
    with Progress(4, "two GPUs", progress) as bar:
        launch, work = _launch_check(a0, b0, g0)
        bar.step("launch checked")
        t_one = time_on_device(one, g0, **timing)
        bar.step(f"1 product on {infos[0].name}")
        t_seq = time_on_device(sequential, g0, **timing)
        bar.step(f"2 products on {infos[0].name}")
        t_par = time_on_device(parallel, g0, **timing)
        bar.step(f"2 products on {infos[0].name} + {infos[1].name}")
        for _ in range(RETRIES):
            if t_seq.steady and t_par.steady:
                break
            # Both again, side by side in time: a ratio of runs from different moments of a
            # busy machine would mix two different loads.
            bar.step("noisy: timing again", n=0)
            seq, par = time_on_device(sequential, g0, **timing), time_on_device(parallel, g0,
                                                                                **timing)
            if seq.median + par.median < t_seq.median + t_par.median:
                t_seq, t_par = seq, par
    speedup = t_seq.median / t_par.median
    # Launch counts as asynchronous when the call returned well before the work was done.
    asynchronous = launch < 0.5 * work
    simulated = any(i.simulated for i in infos)
    cores = cpu_cores()
    load = load_average()
    bound = sim.explain(lambda: a0 @ b0).bound if infos[0].modeled else None
    steady = t_seq.steady and t_par.steady
    explanation = _explain(speedup, asynchronous, simulated, cores, load, infos[0].modeled,
                           bound, steady, split)
    notes = list(explanation)
    busy = busy_note(load, steady)
    if busy:
        notes.append(busy)
    notes.append(f"Launch check: a {size}x{size} product on {infos[0].name} returned after "
                 f"{format_seconds(launch)}, the device finished it after {format_seconds(work)} "
                 f"({'asynchronous' if asynchronous else 'synchronous'} launch).")
    timed = ("Modeled times, the same every call" if infos[0].modeled else
             f"Medians of at least {repeats} calls")
    notes.append(f"{timed}, after {max(warmup, 1)} warm-up; each call waits for its devices "
                 "(devlab.timing).")
    n0, n1 = infos[0].name, infos[1].name
    headers = ["work", "median time", "IQR"]
    rows = [
        [f"1 product on {n0}", format_seconds(t_one.median), t_one.spread],
        [f"2 products on {n0}, one after the other", format_seconds(t_seq.median),
         t_seq.spread],
        [f"2 products on {n0} and {n1} at the same time", format_seconds(t_par.median),
         t_par.spread],
        ["speed-up (in turn / at once)", f"{speedup:.2f}x (ideal {IDEAL:.0f}x)",
         f"efficiency {speedup / IDEAL:.0%}"],
    ]
    data = {
        "size": size,
        "devices": [i.to_dict() for i in infos],
        "one_product": t_one.median,
        "sequential": t_seq.median,
        "parallel": t_par.median,
        "speedup": speedup,
        "steady": steady,
        "ideal": IDEAL,
        "efficiency": speedup / IDEAL,
        "asynchronous_launch": asynchronous,
        "launch_time": launch,
        "work_time": work,
        "cpu_cores": cores,
        "load_average": load,
        "explanation": explanation,
        "bound": bound,
        "split": split,
    }
    return ScalingResult(f"Two products of {size}x{size} on {n0} and {n1}: scaling",
                         infos, data, headers, rows, notes)
