"""Issue 16's critical finding, tried again as it was found: in a real Jupyter kernel, a
`%%distributed` cell (and `devlab.launch`) ends every way it can — success, a rank's error, a
rank's os._exit, the timeout, `interrupt_kernel()` while the ranks are busy, a second interrupt
while it cleans up — and after each, the kernel process has the threads, descriptors,
listening sockets and children it had before (read from /proc and psutil in the kernel,
without running the cycle collector). While the ranks run, a neighbour connecting through the
machine's address beyond loopback to every port the kernel and the ranks listen on is
refused. The issue's sequence of launches that segfaulted runs in the same kernel, before and
after those endings."""

from __future__ import annotations

import json
import queue
import sys
import time
from pathlib import Path

import psutil
import pytest
from jupyter_client.manager import KernelManager
from nbutil import ROOT, _kernel_env, _patched_environ

sys.path.insert(0, str(Path(__file__).resolve().parent / "distributed"))
import hygiene  # noqa: E402

# One worker runs this module: its tests share one expensive module fixture, which
# each worker would otherwise build again.
pytestmark = [pytest.mark.notebook, pytest.mark.xdist_group("test_distributed_kernel")]

HELPERS = Path(__file__).resolve().parent / "distributed"

SETUP = f"""\
%load_ext devlab
%devices --simulate-gpus 2
import json, signal, sys, threading
import torch, devlab
sys.path.insert(0, {str(HELPERS)!r})
import hygiene

def kernel_state():
    state = hygiene.state()
    # IPython's history database opens and closes handles as it writes (its journal, and
    # sqlite's handle on the profile's folder to sync it)
    profile = get_ipython().profile_dir.location
    state["descriptors"] = [d for d in state["descriptors"] if not d[1].startswith(profile)]
    state["sigint"] = repr(signal.getsignal(signal.SIGINT))
    state["torchelastic"] = [t.name for t in threading.enumerate()
                             if "Rendezvous" in t.name or "TailLog" in t.name]
    print(json.dumps(state))
"""
STATE = "kernel_state()"

SUCCESS = """\
%%distributed -n 2
import torch.distributed as dist
dist.init_process_group('nccl')
t = torch.ones(2, device=dist.get_rank())
dist.all_reduce(t)
t.tolist()"""
ERROR = """\
%%distributed -n 2 --timeout 60
import os, torch.distributed as dist
dist.init_process_group('gloo')
if dist.get_rank() == 1:
    {}['missing key']
dist.barrier()"""
SILENT = """\
%%distributed -n 2 --timeout 60
import os, torch.distributed as dist
dist.init_process_group('gloo')
if dist.get_rank() == 0:
    os._exit(7)
dist.barrier()"""
TIMEOUT = """\
%%distributed -n 2 --timeout 3
import time, torch.distributed as dist
dist.init_process_group('gloo')
dist.barrier()
time.sleep(300)"""
BUSY = """\
%%distributed -n 2
import torch.distributed as dist
dist.init_process_group('gloo')
dist.barrier()
print('busy', flush=True)
t = torch.ones(1000)
while True:
    dist.all_reduce(t)"""
BUSY_LAUNCH = """\
import torch, torch.distributed as dist
def busy():
    dist.init_process_group('gloo')
    dist.barrier()
    print('busy', flush=True)
    t = torch.ones(1000)
    while True:
        dist.all_reduce(t)
devlab.launch(busy)"""

# Issue 16's sequence, as it was written: a function returning 42, one touching a
# threading.Lock, one returning a lock, one raising an exception that cannot be pickled, one
# calling sys.exit(5) (the ranks segfaulted "... Garbage-collecting" and the last launch raised
# torchelastic's ChildFailedError instead of SystemExit: 5).
SEQUENCE_SETUP = """\
import threading
LOCK = threading.Lock()
def forty_two():
    return 42
def touch_lock():
    with LOCK:
        return 1
def return_lock():
    return LOCK
class Unpicklable(Exception):
    def __init__(self):
        super().__init__('carries a lock')
        self.lock = threading.Lock()
def raise_unpicklable():
    raise Unpicklable()
def exit_five():
    sys.exit(5)"""
SEQUENCE = {"42": "devlab.launch(forty_two)", "lock": "devlab.launch(touch_lock)",
            "returns a lock": "devlab.launch(return_lock)",
            "unpicklable": "devlab.launch(raise_unpicklable)",
            "sys.exit(5)": "devlab.launch(exit_five)"}


class Kernel:
    """A python3 kernel (as Jupyter starts one) and a client; `run` executes a cell and
    collects what it showed, interrupting it when `interrupt_when(outputs)` says so."""

    def __init__(self) -> None:
        self.km = KernelManager(kernel_name="python3")
        with _patched_environ(_kernel_env()):
            self.km.start_kernel(cwd=str(ROOT))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=180)

    @property
    def pid(self) -> int:
        return self.km.provisioner.pid

    def run(self, code: str, timeout: float = 300, interrupt_when=None, interrupts: int = 1,
            gap: float = 0.0) -> dict[str, object]:
        msg_id = self.kc.execute(code)
        out: dict[str, object] = {"stdout": "", "stderr": "", "error": None, "result": None,
                                  "interrupted": False}
        until = time.monotonic() + timeout
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.1, until - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"the cell did not finish: {out}") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out[content["name"]] += content["text"]
            elif kind == "error":
                out["error"] = (content["ename"], content["evalue"])
            elif kind == "execute_result":
                out["result"] = content["data"].get("text/plain")
            elif kind == "status" and content["execution_state"] == "idle":
                return out
            if interrupt_when is not None and not out["interrupted"] and interrupt_when(out):
                for i in range(interrupts):
                    if i:
                        time.sleep(gap)
                    self.km.interrupt_kernel()
                out["interrupted"] = True

    def state(self) -> dict[str, object]:
        out = self.run(STATE)
        assert out["error"] is None, out
        return json.loads(out["stdout"])

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def _busy(out: dict[str, object]) -> bool:
    return "[rank0] busy" in out["stdout"] and "[rank1] busy" in out["stdout"]


@pytest.fixture(scope="module")
def session():
    """One kernel through every ending; what the neighbour saw while the ranks ran."""
    kernel = Kernel()
    try:
        setup = kernel.run(SETUP)
        assert setup["error"] is None, setup
        warm = kernel.run(SUCCESS)  # what torch and gloo load once per process
        assert warm["error"] is None, warm
        seen: dict[str, object] = {"baseline": kernel.state()}
        neighbour: dict[str, object] = {}

        def look_then_interrupt(out: dict[str, object]) -> bool:
            if not _busy(out):
                return False
            neighbour.update(_look_from_outside(kernel.pid))
            return True

        endings = {
            "success": (SUCCESS, {}),
            "rank's error": (ERROR, {}),
            "rank's os._exit": (SILENT, {}),
            "timeout": (TIMEOUT, {}),
            "interrupt": (BUSY, {"interrupt_when": look_then_interrupt}),
            "two interrupts": (BUSY, {"interrupt_when": _busy, "interrupts": 2, "gap": 0.02}),
            "interrupt burst": (BUSY, {"interrupt_when": _busy, "interrupts": 10, "gap": 0.01}),
            "devlab.launch interrupted": (BUSY_LAUNCH, {"interrupt_when": _busy}),
        }
        assert kernel.run(SEQUENCE_SETUP)["error"] is None
        for round_ in ("first", "after the endings"):  # the second with their garbage about
            if round_ == "after the endings":
                for name, (code, how) in endings.items():
                    seen[name] = kernel.run(code, **how)
                    seen[name + " state"] = kernel.state()
            seen[f"sequence, {round_}"] = {name: kernel.run(code)
                                           for name, code in SEQUENCE.items()}
            seen[f"sequence, {round_} state"] = kernel.state()
        seen["neighbour"] = neighbour
        seen["alive"] = kernel.run("print(torch.ones(1, device='cuda:1').device)")
        yield seen
    finally:
        kernel.close()


def _look_from_outside(kernel_pid: int) -> dict[str, object]:
    """What a neighbour finds while the ranks run: every port the kernel and its ranks
    listen on, and whether connecting to it through the machine's outside address works."""
    kernel = psutil.Process(kernel_pid)
    ranks = [p for p in kernel.children(recursive=True) if not hygiene._register_watcher(p)]
    ports = {"kernel": hygiene.listeners(kernel_pid),
             "ranks": [hygiene.listeners(p.pid) for p in ranks]}
    outside = hygiene.beyond_loopback()
    every = {port for _, port in ports["kernel"]} | {port for rank in ports["ranks"]
                                                      for _, port in rank}
    return {"ports": ports, "outside": outside, "ranks": len(ranks),
            "refused": {port: hygiene.refused(outside, port) for port in every} if outside else {},
            "loopback reaches": {port: not hygiene.refused("127.0.0.1", port) for port in every}}


ENDINGS = ["success", "rank's error", "rank's os._exit", "timeout", "interrupt", "two interrupts",
           "interrupt burst", "devlab.launch interrupted", "sequence, first",
           "sequence, after the endings"]


@pytest.mark.parametrize("ending", ENDINGS)
def test_nothing_of_the_launch_is_left_in_the_kernel(session, ending: str) -> None:
    before, after = session["baseline"], session[ending + " state"]
    assert after["torchelastic"] == []  # no RendezvousKeepAliveTimer, no TailLog
    assert after["children"] == []
    assert after["listeners"] == before["listeners"]  # the kernel's own (zmq) ports only
    assert after["descriptors"] == before["descriptors"]
    assert after["threads"] == before["threads"]
    assert after["os_threads"] == before["os_threads"]
    assert after["sigint"] == before["sigint"]


def test_each_ending_is_what_the_user_should_see(session) -> None:
    assert session["success"]["error"] is None
    assert session["success"]["result"] == "[[2.0, 2.0], [2.0, 2.0]]"
    assert session["rank's error"]["error"] == ("KeyError", "'missing key'")
    assert session["rank's os._exit"]["error"] == (
        "RankError", "rank 0 of 2 ended with exit code 7 without returning or raising "
                     "(os._exit(7) ends a process at once; so does a crash in C code, shown in "
                     "the rank's stderr)")
    assert session["timeout"]["error"][0] == "TimeoutError"
    for name in ("interrupt", "two interrupts", "devlab.launch interrupted"):
        assert session[name]["interrupted"], name
        assert session[name]["error"] == ("KeyboardInterrupt", "the ranks were stopped"), name
    # A burst's last interrupts come after the launch has ended, while IPython shows its
    # error: what the cell then shows is IPython's and ipykernel's business ("KeyboardInterrupt
    # caught in kernel"); that the kernel is left clean is checked above.
    assert session["interrupt burst"]["interrupted"]
    assert "KeyboardInterrupt" in session["interrupt burst"]["stderr"] + str(
        session["interrupt burst"]["error"])
    assert session["alive"]["stdout"].strip() == "cuda:1"


def test_while_the_ranks_run_nothing_is_reachable_beyond_loopback(session) -> None:
    seen = session["neighbour"]
    assert seen["ranks"] == 2
    ports = seen["ports"]
    assert all(rank for rank in ports["ranks"])  # each rank's gloo listens...
    for address, _ in ports["kernel"] + [a for rank in ports["ranks"] for a in rank]:
        assert hygiene.is_loopback(address), ports  # ...on loopback, as the store does
    assert all(seen["loopback reaches"].values())  # live ports, reachable from this machine
    if seen["outside"] is None:
        pytest.skip("this machine has no address beyond loopback to connect through")
    assert seen["refused"] and all(seen["refused"].values()), seen


def test_the_store_the_ranks_met_at_was_the_kernels(session) -> None:
    """The kernel listened on one port more than its own while the ranks ran: the store."""
    during = {port for _, port in session["neighbour"]["ports"]["kernel"]}
    before = {port for _, port in session["baseline"]["listeners"]}
    assert len(during - before) == 1


@pytest.mark.parametrize("round_", ["first", "after the endings"])
def test_the_issues_sequence_gives_clear_errors_and_systemexit_without_a_segfault(
        session, round_: str) -> None:
    seen = session[f"sequence, {round_}"]
    assert seen["42"]["result"] == "[42, 42]" and seen["42"]["error"] is None
    assert seen["lock"]["result"] == "[1, 1]" and seen["lock"]["error"] is None
    ename, evalue = seen["returns a lock"]["error"]  # (the rank that failed first)
    assert ename == "RankError" and evalue in [
        f"rank {r} returned a lock, which cannot be pickled to send it back: "
        "TypeError: cannot pickle '_thread.lock' object" for r in (0, 1)], evalue
    ename, evalue = seen["unpicklable"]["error"]
    assert ename == "RankError" and evalue.endswith("Unpicklable: carries a lock"), evalue
    assert seen["sys.exit(5)"]["error"] == ("SystemExit", "5")
    for name, out in seen.items():
        shown = f"{out['stdout']}{out['stderr']}{out['error']}"
        for word in ("Fatal Python error", "Segmentation fault", "ChildFailedError"):
            assert word not in shown, (name, shown)
