"""`%%distributed` in a real Jupyter kernel: ranks' labelled output, a failing rank's own
traceback, a hung rank's timeout, and afterwards a kernel as it was: alive, no process left,
the same signal handlers, devlab and torch unchanged."""

from __future__ import annotations

import re

import pytest
from nbutil import errors, run_cells, stream, text

# One worker runs this module: its tests share one expensive module fixture, which
# each worker would otherwise build again.
pytestmark = [pytest.mark.notebook, pytest.mark.xdist_group("test_distributed_notebook")]

SNAPSHOT = """\
import logging, os, signal, sys, threading, psutil, torch, devlab
def snapshot():
    return (
        {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)},
        dict(os.environ), sys.stdout, sys.stderr,
        torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack(),
        torch.get_default_device(), devlab.simulated.device_count(),
        [logging.getLogger(n).level for n in ("torch.distributed.elastic", "torch.multiprocessing")],
    )
def left():
    # multiprocessing's resource tracker, and the simulated machine's register watcher (it
    # lives as long as the simulation), are not a launch's
    return [p.cmdline()[:3] for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())
            and "devlab-gpus-" not in " ".join(p.cmdline())]
before = snapshot()"""

CHECK = "print(snapshot() == before, left())"


@pytest.fixture(scope="module")
def cells():
    return run_cells(
        "%load_ext devlab\n%devices --simulate-gpus 2",
        SNAPSHOT,
        # 0: DDP on two ranks, from a cell
        "%%distributed -n 2\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('nccl')\n"
        "rank = dist.get_rank()\n"
        "t = torch.ones(2, device=rank) * (rank + 1)\n"
        "dist.all_reduce(t)\n"
        "print('sum', t.tolist(), 'on', t.device)\n"
        "(rank, t.device.index)",
        CHECK,
        # 2: a failing rank
        "%%distributed -n 2 --timeout 60\n"
        "import os\n"
        "rank = int(os.environ['RANK'])\n"
        "if rank == 1:\n"
        "    {}['missing key']\n"
        "rank",
        CHECK,
        # 4: a hung rank
        "%%distributed -n 2 --timeout 3\n"
        "import os, time\n"
        "if os.environ['RANK'] == '0':\n"
        "    time.sleep(300)\n",
        CHECK,
        # 6: the kernel is alive and the simulation as before
        "print(torch.ones(1, device='cuda:1').device)",
        # 7: usage mistakes
        "%%distributed -n 0\npass",
        "%%distributed --timeout -2\npass",
        # 9-11: issue 16's low findings, as written there
        "%%distributed -n 2\nimport os\nif os.environ['RANK'] == '1':\n    os._exit(7)\n"
        "import time\ntime.sleep(30)",
        "%%distributed -n 2 --export /nonexistent/folder/train.py\npass",
        "%%distributed -n 10000\npass",
        CHECK,
        timeout=300,
    )[2:]


def test_a_cell_runs_on_two_ranks_with_labelled_output(cells) -> None:
    cell = cells[0]
    assert not errors(cell), text(cell)
    out = sorted(stream(cell).splitlines())
    assert out == ["[rank0] sum [3.0, 3.0] on cuda:0", "[rank1] sum [3.0, 3.0] on cuda:1"]
    notice = "runs on gloo instead"
    assert sorted(line.split(" ", 1)[0] for line in stream(cell, "stderr").splitlines()
                  if notice in line) == ["[rank0]", "[rank1]"]
    assert text(cell).strip().endswith("[(0, 0), (1, 1)]")


def test_a_failing_rank_shows_its_own_traceback_with_the_cells_lines(cells) -> None:
    (err,) = errors(cells[2])
    assert err.ename == "KeyError" and err.evalue == "'missing key'"
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(err.traceback))
    assert re.search(r"----> 5\s+\{\}\['missing key'\]", shown), shown
    assert "(raised on rank 1 of 2)" in shown


def test_a_hung_rank_is_stopped_after_the_timeout(cells) -> None:
    (err,) = errors(cells[4])
    assert err.ename == "TimeoutError"
    assert err.evalue == ("rank 0 of 2 did not finish within 3 s and was stopped: rank 0 was at "
                          "line 4: time.sleep(300)")
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(err.traceback))
    assert re.search(r"----> 4\s+time\.sleep\(300\)", shown), shown


@pytest.mark.parametrize("after", [1, 3, 5], ids=["success", "failure", "timeout"])
def test_afterwards_the_kernel_is_as_before_with_no_process_left(cells, after: int) -> None:
    assert not errors(cells[after])
    assert stream(cells[after]).strip() == "True []"


def test_the_kernel_is_alive_and_still_simulating(cells) -> None:
    assert stream(cells[6]).strip() == "cuda:1"


def test_bad_arguments_are_one_line_usage_errors(cells) -> None:
    assert text(cells[7]).strip() == ("UsageError: nprocs is the number of ranks, a whole number of at "
                              "least 1; got 0")
    assert text(cells[8]).strip() == ("UsageError: timeout is a number of seconds greater than 0 (or "
                              "None), got -2.0")


def test_export_writes_a_script_torchrun_can_run(tmp_path) -> None:
    script = tmp_path / "train.py"
    cells = run_cells(
        "%load_ext devlab\nimport torch\nimport torch.distributed as dist\nfrom torch import nn\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\nwidth = 4",
        f"%%distributed -n 2 --export {script}\n"
        "dist.init_process_group('gloo')\n"
        "model = DDP(nn.Linear(width, 1))\n"
        "print(dist.get_rank(), torch.__name__)",
    )
    assert not errors(cells[1]), text(cells[1])
    shown = text(cells[1])
    assert f"Wrote {script}: torchrun --standalone --nproc-per-node 2 train.py" in shown
    assert "defined in the notebook, not in the script (add them to it): width" in shown
    written = script.read_text()
    assert written.splitlines()[2:8] == [
        "", "from torch.nn.parallel.distributed import DistributedDataParallel as DDP",
        "import torch.distributed as dist", "from torch import nn", "import torch", ""]
    assert written.rstrip().endswith("print(dist.get_rank(), torch.__name__)")


def test_spawned_ranks_get_the_notebooks_functions_and_gpus() -> None:
    cells = run_cells(
        "%load_ext devlab\n%devices --simulate-gpus 2\nimport torch\nscale = 3\n"
        "def triple(x):\n    return x * scale",
        "%%distributed -n 2 --start-method spawn\nimport os\nrank = int(os.environ['RANK'])\n"
        "print('GPUs:', torch.cuda.device_count())\ntriple(torch.ones(2, device=rank))",
    )
    assert not errors(cells[1]), text(cells[1])
    assert sorted(stream(cells[1]).splitlines()) == ["[rank0] GPUs: 2", "[rank1] GPUs: 2"]
    assert text(cells[1]).strip().endswith(
        "[tensor([3., 3.], device='cuda:0'), tensor([3., 3.], device='cuda:1')]")


def test_a_ranks_os_exit_is_one_clear_error_without_devlabs_frames(cells) -> None:
    (err,) = errors(cells[9])
    assert (err.ename, err.evalue) == ("RankError", (
        "rank 1 of 2 ended with exit code 7 without returning or raising (os._exit(7) ends a "
        "process at once; so does a crash in C code, shown in the rank's stderr)"))
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(err.traceback))
    assert shown == f"RankError: {err.evalue}"  # no internal traceback


def test_a_bad_export_path_and_too_many_ranks_are_usage_errors_and_leave_nothing(cells) -> None:
    assert text(cells[10]).strip() == ("UsageError: cannot write the script to "
                                       "'/nonexistent/folder/train.py': the folder "
                                       "'/nonexistent/folder' does not exist")
    shown = text(cells[11]).strip()
    assert shown.startswith("UsageError: nprocs=10000 is more ranks than this machine can run "
                            "here: "), shown
    assert re.search(r"; at most \d+ ranks$", shown), shown
    assert "\n" not in shown
    assert stream(cells[12]).strip() == "True []"
