"""The command line: `python -m devlab run --simulate-gpus N script.py [args]` (or the `devlab` command): run a
program written for GPUs on simulated ones."""

from __future__ import annotations

import argparse
import os
import runpy
import sys

DESCRIPTION = """\
Run a Python program (a script, or -m module) on N simulated GPUs.

What is simulated: torch.cuda reports N CUDA devices (cuda:0 ... cuda:N-1, "Simulated GPU i
(CPU-backed)") whose tensors live in host memory and are computed on the CPU. Values are real;
device placement, copies between devices, mixed-device errors and out-of-memory errors (with
--memory-limit) behave as on real GPUs. torch.distributed runs on gloo where the program asks
for NCCL (a CPU build of torch has no NCCL), and says so once. Speed says nothing about a real
GPU. Not simulated: cuDNN, CUDA's own random streams; torch.compile'd code runs
uncompiled (and says so).

Every Python process the program starts sees the same GPUs, through DEVLAB_SIMULATE_GPUS and
the start-up hook pip installs with devlab: torch.multiprocessing.spawn, multiprocessing
(spawn, fork, forkserver), torchrun's workers, DataLoader workers.
"""

EPILOG = """\
examples:
  python -m devlab run --simulate-gpus 2 train.py --epochs 3
  python -m devlab run --simulate-gpus 2 -m torch.distributed.run --standalone --nproc-per-node 2 train.py
  DEVLAB_SIMULATE_GPUS=2 torchrun --standalone --nproc-per-node 2 train.py   (the same, with the hook)
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m devlab", description=DESCRIPTION,
                                     epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="run")
    run = commands.add_parser("run", help="run a script or module on simulated GPUs",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              usage="python -m devlab run [--simulate-gpus N] [--memory-limit MB] "
                                    "(script.py | -m module) [args ...]")
    run.add_argument("--simulate-gpus", type=int, metavar="N",
                     help="how many GPUs to simulate (default: $DEVLAB_SIMULATE_GPUS)")
    run.add_argument("--memory-limit", type=int, metavar="MB",
                     help="each simulated GPU's memory in MB (default: unlimited, the host's); "
                          "$DEVLAB_SIMULATE_GPU_MODEL and $DEVLAB_SIMULATE_GPU_TOPOLOGY choose "
                          "the GPU modeled and its machine")
    run.add_argument("-m", dest="module", metavar="module", help="run a module, as python -m does")
    run.add_argument("target", nargs="?", metavar="script.py", help="the script to run")
    return parser


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """devlab's own arguments, and the program's (everything from the script, or from -m's
    module's first argument, on)."""
    takes_value = {"--simulate-gpus", "--memory-limit"}
    i = 1 if argv[:1] == ["run"] else 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return argv[:i + 2], argv[i + 2:]
        if arg in takes_value:
            i += 2
        elif arg.startswith("-"):
            i += 1
        else:
            return argv[:i + 1], argv[i + 1:]
    return argv, []


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, program_args = _split(argv)
    parser = _parser()
    args = parser.parse_args(own)
    if args.command != "run":
        parser.print_help()
        raise SystemExit(2)
    if (args.module is None) == (args.target is None):
        parser.error("run needs a script to run, or -m and a module (not both)")
    count = args.simulate_gpus
    if count is None:
        raw = os.environ.get("DEVLAB_SIMULATE_GPUS", "").strip()
        if not raw.isdigit() or int(raw) < 1:
            parser.error("say how many GPUs to simulate: --simulate-gpus N "
                         "(or set DEVLAB_SIMULATE_GPUS=N)")
        count = int(raw)
    if count < 1:
        parser.error(f"--simulate-gpus is a whole number of at least 1, got {count}")
    if args.memory_limit is not None and args.memory_limit < 1:
        parser.error(f"--memory-limit is a number of MB of at least 1, got {args.memory_limit}")
    # For the processes the program starts (their start-up hook reads these), then for this one.
    os.environ["DEVLAB_SIMULATE_GPUS"] = str(count)
    if args.memory_limit is not None:
        os.environ["DEVLAB_SIMULATE_GPU_MEMORY_MB"] = str(args.memory_limit)
    from devlab.core import config

    # The GPU they model and the machine, as the start-up hook reads them for the processes the
    # program starts: this process models the same GPU as its children.
    model = os.environ.get("DEVLAB_SIMULATE_GPU_MODEL", "").strip() or None
    topology = os.environ.get("DEVLAB_SIMULATE_GPU_TOPOLOGY", "").strip() or None
    try:
        config.simulate_gpus(count, memory_limit=args.memory_limit, model=model,
                             topology=topology)
    except ValueError as e:
        named = ", ".join(f"{name}={value!r}" for name, value in (
            ("DEVLAB_SIMULATE_GPU_MODEL", model), ("DEVLAB_SIMULATE_GPU_TOPOLOGY", topology))
            if value)
        parser.error(f"{named}: {e}" if named else str(e))
    if args.module is not None:
        sys.argv = [args.module, *program_args]
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [args.target, *program_args]
        sys.path[0] = os.path.dirname(os.path.abspath(args.target))
        runpy.run_path(args.target, run_name="__main__")

