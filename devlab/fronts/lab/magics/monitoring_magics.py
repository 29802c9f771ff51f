"""`%%memwatch` and `%%compare_devices`: live memory and device timing under a cell.

Thin: parse the arguments, call `devlab.memory` / `devlab.timing` through the widgets, show
the results. Registered by devlab's extension loader; by hand:
`get_ipython().register_magics(MonitoringMagics)`.
"""

from __future__ import annotations

from typing import Any

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.display import display

from devlab.fronts.lab.magics.cell import compile_cell, run_body
from devlab.fronts.lab.magics.usage import parse_args, usage_errors

__all__ = ["MonitoringMagics"]


@magics_class
class MonitoringMagics(Magics):
    """Live memory charts and device timing comparisons for notebook cells."""

    def __repr__(self) -> str:
        return "MonitoringMagics(%%memwatch, %%compare_devices)"

    # The name is what the help's usage line shows: "%%memwatch", a cell magic.
    @magic_arguments.magic_arguments(name="%memwatch")
    @magic_arguments.argument(
        "--device", "-d", action="append", metavar="NAME", default=None,
        help="Device to watch: /GPU:0, /CPU:0, cuda:1, cpu... Repeat for several. "
             "Default: every GPU (real or simulated), or the CPU when there is none. "
             "GPUs show allocated memory (and reserved, where torch's allocator keeps more), "
             "the CPU shows this process's resident memory.")
    @magic_arguments.argument(
        "--interval", "-i", type=float, default=50.0, metavar="MS",
        help="Milliseconds between two readings (default 50, i.e. 20 per second).")
    @magic_arguments.argument(
        "--trace", "-t", action="store_true",
        help="Also record every allocation and free the cell makes on the watched GPUs, with "
             "the line of the cell behind each, and draw them under the cell as a timeline "
             "(hover a band for its size and line), with the lines holding the most at the "
             "peak. Real GPUs record through torch's _record_memory_history; simulated ones "
             "through their model of CUDA's allocator.")
    @magic_arguments.argument(
        "--save", metavar="PATH", default=None,
        help="With --trace: also write what was recorded as a snapshot pickle, which "
             "PyTorch's memory viewer (pytorch.org/memory_viz) opens.")
    @cell_magic
    def memwatch(self, line: str, cell: str) -> Any:
        """Run the cell with a live memory chart under it, and a summary after.

        One background thread reads each device's memory every --interval ms; the chart
        (one line per device, the memory limit dashed when one is set) redraws a few times
        a second while the cell runs. When the cell ends, also by an error or an interrupt,
        the thread stops and a summary shows each device's peak, its growth over the cell
        and what is still held.

        With --trace, every allocation and free on the watched GPUs is recorded too and
        drawn under the summary as a timeline of the cell's memory, line by line.

        Example::

            %%memwatch --device /GPU:0 --interval 20
            x = torch.ones(1024, 1024, 256, device="cuda")
        """
        from devlab.core.memory_watch.allocation_trace import trace_for
        from devlab.core.memory_watch.sampler import check_interval
        from devlab.fronts.lab.widgets import MemoryMonitor

        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame in tracebacks
        args = parse_args(self.memwatch, line)
        with usage_errors():
            interval = check_interval(args.interval, "--interval", "ms")
            if args.save is not None and not args.trace:
                raise ValueError("--save writes what --trace records: add --trace")
            monitor = MemoryMonitor(args.device, interval=interval, show_summary=False)
            try:
                trace = trace_for(monitor.sampler.readers, args.save) if args.trace else None
            except BaseException:
                monitor.release()  # refused before it started: no widget left behind
                del monitor  # nor, through this frame in the traceback, its chart
                raise
        try:
            monitor.display_live()
            monitor.start()
            if trace is not None:
                trace.start()
            return run_body(self.shell, cell, f"%%memwatch {line}")
        finally:
            # Whatever happened in the cell: stop and join the thread, leave the final chart as
            # static output (no widget, no figure left in the kernel), say what it saw.
            try:
                summary = monitor.stop()
            finally:
                monitor.release()
                # An error's traceback keeps this frame (sys.last_traceback): not the monitor.
                del monitor
            display(summary)
            if trace is not None:
                for shown in trace.finish():
                    display(shown)

    @magic_arguments.magic_arguments(name="%compare_devices")
    @magic_arguments.argument(
        "devices", nargs="+", metavar="NAME",
        help="Devices to run the cell on, the first being the baseline of the speed-ups: "
             "/CPU:0 /GPU:0 /GPU:1, cpu cuda:0...")
    @magic_arguments.argument(
        "--setup", "-s", default="", metavar="CODE",
        help="Code run once on each device before timing, not timed (e.g. making inputs): "
             "--setup \"x = torch.rand(2000, 2000)\".")
    @magic_arguments.argument(
        "--warmup", type=int, default=2, metavar="N",
        help="Untimed runs before measuring (default 2).")
    @magic_arguments.argument(
        "--min-time", type=float, default=0.2, metavar="S",
        help="Measure each device for at least this many seconds (default 0.2).")
    @magic_arguments.argument(
        "--repeats", "-r", type=int, default=5, metavar="N",
        help="Measure at least this many blocks of calls (default 5).")
    @magic_arguments.argument(
        "--output", "-o", action="store_true",
        help="Return the devlab.timing.Comparison (data, table, plot) as the cell's value.")
    @cell_magic
    def compare_devices(self, line: str, cell: str) -> Any:
        """Time the cell on each device and chart the times side by side, with speed-ups.

        Each device runs the cell as its default device (`devlab.device(NAME)`): tensors the
        cell creates land there. A cell whose tensors live on another device (made before,
        outside --setup) is refused with a UsageError naming both devices, rather than timed
        under the wrong name; one that runs on several devices is timed on all of them. Timing is devlab.timing's: warm-up runs, the device
        synchronized before each clock stops (unlike %timeit, which times only the launch
        of GPU work), repeats until --min-time, median and interquartile range. The cell
        runs in a copy of the notebook's namespace: it reads your variables, and what it
        assigns does not leak out.

        Example::

            %%compare_devices /CPU:0 /GPU:0 --setup "x = torch.rand(1000, 1000)"
            y = x @ x
        """
        from devlab.core.placement_scope import resolve_device
        from devlab.core.timing import DeviceMismatch, check_options, time_on_device
        from devlab.fronts.lab.widgets import TimingChart

        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame in tracebacks
        args = parse_args(self.compare_devices, line)
        with usage_errors():
            check_options(warmup=args.warmup, repeats=args.repeats, min_time=args.min_time,
                          flags=True)
            for name in args.devices:
                resolve_device(name)
        body, _ = compile_cell(self.shell, cell, "timed", f"%%compare_devices {line}")
        setup_code = args.setup  # parse_args took off its quotes
        setup = compile_cell(self.shell, setup_code, "setup")[0] if setup_code.strip() else None
        user_ns = self.shell.user_ns
        chart = TimingChart(len(args.devices), show_table=not args.output)
        try:
            chart.display_live()
            for name in args.devices:
                ns = dict(user_ns)  # the cell's assignments stay in this copy

                def run(ns: dict = ns) -> None:
                    __tracebackhide__ = True  # noqa: F841
                    exec(body, ns)

                def prepare(ns: dict = ns) -> None:
                    __tracebackhide__ = True  # noqa: F841
                    if setup is not None:
                        exec(setup, ns)

                chart.starting(name)
                try:
                    result = time_on_device(
                        run, name, setup=prepare, warmup=args.warmup, min_time=args.min_time,
                        repeats=args.repeats, progress=chart.progress)
                except DeviceMismatch as e:
                    # The cell's tensors live elsewhere than the device named: a mistake in how
                    # the magic was used, said in one line.
                    chart.stopped(f"stopped on {name}: the cell ran elsewhere")
                    raise UsageError(f"{e} Tensors made in --setup or in the cell itself are "
                                     "made on each device in turn.") from None
                except BaseException as e:
                    chart.stopped(f"stopped on {name}: {type(e).__name__}")
                    raise
                chart.add(result)
        finally:
            comparison = chart.comparison
            chart.release()  # the final chart stays as static output; no widget is left
            del chart  # an error's traceback keeps this frame, not the chart
        return comparison if args.output else None
