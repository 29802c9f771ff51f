"""`%%distributed`: run a cell on N ranks of torch.distributed. Thin: parse the arguments, compile
the cell, call `devlab.distributed`, show what it returns."""

from __future__ import annotations

from typing import Any

from IPython.core import magic_arguments
from IPython.core.magic import Magics, cell_magic, magics_class

from devlab.core import ranks as distributed
from devlab.core.placement_log import DEFAULT_LIMIT, PlacementLog
from devlab.fronts.lab.magics.cell import compile_cell
from devlab.fronts.lab.magics.usage import parse_args, usage_errors

__all__ = ["DistributedMagics", "RankLogs"]


class RankLogs:
    """Each rank's placement log, under a heading naming the rank."""

    def __init__(self, logs: list[PlacementLog], limit: int = DEFAULT_LIMIT) -> None:
        self.logs = logs
        self.limit = limit

    def _repr_html_(self) -> str:
        return "".join(f"<div><b>rank {r}</b>{log.render_html(self.limit)}</div>"
                       for r, log in enumerate(self.logs))

    def __repr__(self) -> str:
        return "\n".join(f"rank {r}\n{log.render_text(self.limit)}"
                         for r, log in enumerate(self.logs))


@magics_class
class DistributedMagics(Magics):
    """Data parallel from a cell: the cell runs on every rank."""

    @magic_arguments.magic_arguments(name="%distributed")
    @magic_arguments.argument(
        "-n", "--nprocs", type=int, default=2, metavar="N",
        help="Number of ranks (processes) to run the cell on (default 2).")
    @magic_arguments.argument(
        "--timeout", type=float, default=None, metavar="S",
        help="Stop the ranks if they have not finished after S seconds, and say where each was.")
    @magic_arguments.argument(
        "--log", action="store_true",
        help="Show each rank's placement log: the device of every op, and the collectives "
             "(all-reduce, broadcast...) with their bytes.")
    @magic_arguments.argument(
        "--limit", type=int, default=None, metavar="N",
        help=f"With --log: at most N lines per rank (default {DEFAULT_LIMIT}).")
    @magic_arguments.argument(
        "--start-method", choices=distributed.START_METHODS, default=None,
        help="How ranks start: fork (default where safe: they see the notebook's variables) "
             "or spawn (they get the variables the cell uses that can be pickled).")
    @magic_arguments.argument(
        "--export", default=None, metavar="PATH",
        help="Do not run: write the cell as a script for torchrun (PATH ending in .py).")
    @cell_magic
    def distributed(self, line: str, cell: str) -> Any:
        """Run the cell on N ranks of torch.distributed, as `torchrun --nproc-per-node N` runs a
        script: each rank is a process with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
        MASTER_PORT set, and the cell calls `dist.init_process_group(...)` itself (on simulated
        GPUs "nccl" runs on gloo). Each rank's output appears labelled [rankN]. A rank that
        fails raises its own error here, with its traceback through the cell's lines; the
        cell's value is the list of each rank's value of its last expression. The ranks talk
        over loopback only, and however the cell ends (an interrupt too) no rank, listener or
        descriptor of theirs is left in the kernel.

        Example::

            %%distributed -n 2 --log
            import torch.distributed as dist
            dist.init_process_group("nccl")
            rank = dist.get_rank()
            t = torch.ones(3, device=rank) * rank
            dist.all_reduce(t)
            t.tolist()
        """
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame in tracebacks
        with usage_errors():  # every argument is checked here, before anything starts
            args = parse_args(self.distributed, line)
            if args.limit is not None and args.limit < 0:
                raise ValueError(f"--limit is the number of lines to show, 0 or more; got {args.limit}.")
            distributed.check_options(args.nprocs, args.start_method, args.timeout)
            if args.export:
                return distributed.export_script(cell, args.export.strip("'\""),
                                                 self.shell.user_ns, args.nprocs)
        code, value = compile_cell(self.shell, cell, "cell", f"%%distributed {line}")
        ranks = distributed.run_code(code, value, self.shell.user_ns, nprocs=args.nprocs,
                                     start_method=args.start_method, timeout=args.timeout,
                                     placement_log=args.log)
        if args.log:
            from IPython.display import display

            display(RankLogs([log for log in ranks.logs if log is not None],
                             DEFAULT_LIMIT if args.limit is None else args.limit))
        return ranks.values if any(v is not None for v in ranks.values) else None
