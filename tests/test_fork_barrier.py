"""Ranks forked by torch's launchers on simulated GPUs: they start only once all are forked (no
parent thread can hold a lock for them at a fork), and a launch whose ranks all wait is
reported, with where each waits, within the hang timeout instead of never ending."""

from __future__ import annotations

import gc
import multiprocessing
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

import devlab
from devlab.engine.simulated.torch_distributed.fork_safety import (
    barrier,
    fork_hazard,
    hang_report,
    quiet_window,
)

# The test's own fork hooks (registered once; they act only while a test switches them on).
_gate: dict[str, object] = {"on": False, "forks": 0, "held": None, "fork_times": [], "wait": 3}


def _before_fork() -> None:
    if _gate["on"] and _gate["forks"] >= 1 and _gate["held"] is not None:
        # the second fork waits (up to 3 s) for the parent's thread to hold its lock: a fork
        # at the worst moment, every time
        _gate["held"].wait(_gate["wait"])  # type: ignore[attr-defined]


def _after_fork_in_parent() -> None:
    if _gate["on"]:
        _gate["forks"] = int(_gate["forks"]) + 1  # type: ignore[call-overload]
        _gate["fork_times"].append(time.monotonic())  # type: ignore[attr-defined]


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)


@pytest.fixture
def gate():
    _gate.update(on=True, forks=0, held=threading.Event(), fork_times=[], wait=3)
    yield _gate
    _gate.update(on=False, forks=0, held=None, fork_times=[], wait=3)


@pytest.fixture
def hang_timeout():
    yield devlab.simulated.set_hang_timeout
    devlab.simulated.reset_hang_timeout()


_lock = threading.Lock()  # stands for glibc's resolver lock: a plain lock fork does not reset


def _serve(server: socket.socket, held: threading.Event, name: bytes = b"",
           named: threading.Event | None = None) -> None:
    """The parent's store thread: it takes the lock for each peer (glibc's getnameinfo);
    `name`: its name as the kernel knows it (torch names its store threads)."""
    if name:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(15, name, 0, 0, 0)  # PR_SET_NAME
    if named is not None:
        named.set()
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with _lock:
            held.set()
            time.sleep(2)
        conn.close()


def _connect_then_lock(i: int, port: int, out: str) -> None:
    with socket.create_connection(("127.0.0.1", port)):
        pass
    got = _lock.acquire(timeout=4)  # the child's own getnameinfo
    Path(out, f"{i}").write_text("ok" if got else "stuck")


def _race(tmp_path: Path) -> dict[str, str]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    thread = threading.Thread(target=_serve, args=(server, _gate["held"]), daemon=True)
    thread.start()
    try:
        mp.start_processes(_connect_then_lock, args=(server.getsockname()[1], str(tmp_path)),
                           nprocs=2, start_method="fork")
    finally:
        server.close()
    return {p.name: p.read_text() for p in tmp_path.iterdir()}


def test_without_the_barrier_a_rank_inherits_a_held_lock(no_simulation, gate, tmp_path):
    # torch's own start_processes: rank 0 connects while rank 1 is still to be forked, the
    # parent's thread takes its lock for rank 0, rank 1 is forked with it held and never gets it
    assert _race(tmp_path) == {"0": "ok", "1": "stuck"}


def test_the_barrier_forks_every_rank_before_any_runs(two, gate, tmp_path):
    assert _race(tmp_path) == {"0": "ok", "1": "ok"}


def _stamp(i: int, out: str) -> None:
    Path(out, f"{i}").write_text(repr(time.monotonic()))


def test_ranks_start_after_the_last_fork(two, gate, tmp_path):
    _gate["held"] = None  # no waiting at forks here
    mp.start_processes(_stamp, args=(str(tmp_path),), nprocs=3, start_method="fork")
    last_fork = max(_gate["fork_times"])  # type: ignore[type-var]
    starts = [float(p.read_text()) for p in tmp_path.iterdir()]
    assert len(starts) == 3 and min(starts) >= last_fork


def _one_waits_forever(i: int) -> None:
    if i == 1:
        threading.Event().wait()  # the line the report must show


def test_a_hung_rank_is_reported_with_its_stack(two, hang_timeout, capfd):
    hang_timeout(2)
    start = time.monotonic()
    with pytest.raises(mp.ProcessExitedException, match="process 1 terminated with exit code 124"):
        mp.start_processes(_one_waits_forever, nprocs=2, start_method="fork")
    took = time.monotonic() - start
    err = capfd.readouterr().err
    assert 2 <= took < 10, took
    assert "no process of this launch made progress for 2 s" in err
    assert "process 1 of the launch" in err
    assert "threading.Event().wait()  # the line the report must show" in err
    assert "_report_and_exit" not in err  # the watchdog's own thread is left out


def _one_computes_one_waits(i: int, out: str) -> None:
    if i == 0:
        end = time.monotonic() + 4
        while time.monotonic() < end:  # busy: the launch makes progress
            sum(range(1000))
        Path(out, "done").write_text("")
    else:
        while not Path(out, "done").exists():  # waits for its peer, idle
            time.sleep(0.05)


def test_a_rank_waiting_for_a_busy_peer_is_not_a_hang(two, hang_timeout, tmp_path, capfd):
    hang_timeout(1.5)
    mp.start_processes(_one_computes_one_waits, args=(str(tmp_path),), nprocs=2,
                       start_method="fork")
    assert "made progress" not in capfd.readouterr().err


def test_hang_timeout_settings(monkeypatch, hang_timeout):
    monkeypatch.delenv(hang_report.HANG_ENV, raising=False)
    assert devlab.simulated.hang_timeout() == hang_report.DEFAULT_HANG_TIMEOUT
    monkeypatch.setenv(hang_report.HANG_ENV, "30")
    assert devlab.simulated.hang_timeout() == 30.0
    monkeypatch.setenv(hang_report.HANG_ENV, "off")
    assert devlab.simulated.hang_timeout() is None
    monkeypatch.setenv(hang_report.HANG_ENV, "soon")
    with pytest.raises(ValueError, match="DEVLAB_HANG_TIMEOUT is a number of seconds greater "
                                         "than 0, or 'off', got 'soon'"):
        devlab.simulated.hang_timeout()
    hang_timeout(5)  # set in Python, it wins over the environment
    assert devlab.simulated.hang_timeout() == 5.0
    hang_timeout(None)
    assert devlab.simulated.hang_timeout() is None
    for bad in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="the hang timeout is a number of seconds"):
            hang_timeout(bad)
    assert devlab.simulated.hang_timeout() is None  # a refused value changed nothing


def test_a_bad_environment_stops_the_launch_before_any_fork(two, monkeypatch, gate):
    monkeypatch.setenv(hang_report.HANG_ENV, "-3")
    with pytest.raises(ValueError, match="DEVLAB_HANG_TIMEOUT"):
        mp.start_processes(_stamp, args=("/nonexistent",), nprocs=2, start_method="fork")
    assert _gate["forks"] == 0


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_an_error_between_forks_releases_the_forked_and_leaves_nothing(two, gate, tmp_path,
                                                                      monkeypatch):
    import tempfile

    _gate["held"] = None
    real = tempfile.NamedTemporaryFile
    made = []

    def second_fails(*args, **kwargs):  # torch's start_processes makes one per rank
        made.append(1)
        if len(made) == 2:
            raise OSError("no room for the second rank's error file")
        return real(*args, **kwargs)

    before = _fds()
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", second_fails)
    with pytest.raises(OSError, match="no room"):
        mp.start_processes(_stamp, args=(str(tmp_path),), nprocs=2, start_method="fork")
    monkeypatch.undo()
    deadline = time.monotonic() + 10
    while not Path(tmp_path, "0").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path(tmp_path, "0").exists()  # the rank forked before the error was let go
    assert barrier._window is None
    # what torch's start_processes lost on its error (the forked Process and its pipes) goes
    # once multiprocessing reaps it; devlab's pipe and mapping are gone already
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    gc.collect()
    assert _fds() == before


def test_stop_puts_torchs_start_processes_back(no_simulation):
    spawn = sys.modules["torch.multiprocessing.spawn"]  # torch.multiprocessing.spawn: a function
    originals = (mp.start_processes, spawn.start_processes)
    devlab.simulated.start(2)
    assert mp.start_processes is not originals[0]
    devlab.simulated.stop()
    assert (mp.start_processes, spawn.start_processes) == originals
    assert mp.start_processes is originals[0] and spawn.start_processes is originals[1]


@pytest.mark.notebook
def test_a_hung_notebook_launcher_cell_ends_with_the_report():
    """Lesson 06's launcher in a real kernel: rank 1 never joins its peer; the cell shows where
    each rank waits and ends, rather than running for ever."""
    from nbutil import run_cells, text

    cells = run_cells(
        "import devlab, torch\n"
        "lab = devlab.lesson.setup(gpus=2)\n"
        "devlab.simulated.set_hang_timeout(5)  # seconds; the default is 180",
        "import os, threading, time\n"
        "from accelerate import Accelerator, notebook_launcher\n"
        "\n"
        "def train():\n"
        "    accelerator = Accelerator()\n"
        "    if accelerator.process_index == 1:\n"
        "        threading.Event().wait()  # rank 1 never comes back\n"
        "    accelerator.wait_for_everyone()\n"
        "\n"
        "start = time.monotonic()\n"
        "try:\n"
        "    notebook_launcher(train, num_processes=2)\n"
        "except Exception as e:\n"
        "    print('raised', type(e).__name__, 'after', round(time.monotonic() - start), 's')\n"
        "    time.sleep(1)  # the ranks' last words reach the cell",
        timeout=180)
    out = text(cells[1])
    assert "raised ChildFailedError after" in out, out
    took = int(out.split("raised ChildFailedError after ")[1].split(" s")[0])
    assert took < 60, out
    assert "no process of this launch made progress for 5 s" in out, out
    assert "rank 1 (pid" in out and "threading.Event().wait()  # rank 1 never comes back" in out
    assert "rank 0 (pid" in out and "accelerator.wait_for_everyone()" in out


def _rank_one_waits_forever() -> int:
    rank = int(os.environ["RANK"])
    if rank == 1:
        threading.Event().wait()  # devlab.launch's rank 1 never returns
    return rank


def test_devlabs_own_forked_ranks_get_the_hang_report(two, hang_timeout, capfd):
    hang_timeout(2)
    start = time.monotonic()
    with pytest.raises(Exception) as raised:
        devlab.distributed.launch(_rank_one_waits_forever, nprocs=2, start_method="fork")
    took = time.monotonic() - start
    out = capfd.readouterr()
    shown = out.out + out.err + str(raised.value)
    assert took < 20, took
    assert "no process of this launch made progress for 2 s" in shown, shown
    assert "threading.Event().wait()  # devlab.launch's rank 1 never returns" in shown, shown
    assert "was stopped by devlab's hang report (exit code 124)" in str(raised.value)


# -- forks no launcher announces: plain multiprocessing, os.fork ------------------------------

_fork = multiprocessing.get_context("fork")


# The race itself (a child forked while the parent's store thread holds a lock, with and
# without the quiet window) is counted by benchmarks/plain_fork_stress.py with a real TCPStore
# (torch alone 14 of 1200 children hung, simulated 0 of 1200): as unit tests it depended on
# when a loaded machine ran each fork, and failed both ways under CI's load. The window's
# mechanics are tested below by when each child starts.


def _stamp_and_exit(i: int, out: str) -> None:
    Path(out, f"{i}").write_text(repr(time.monotonic()))


def _fork_three(out: str) -> list[float]:
    """Two multiprocessing ranks and one os.fork, as fast as the parent can; the fork times."""
    ranks = [_fork.Process(target=_stamp_and_exit, args=(i, out)) for i in range(2)]
    for rank in ranks:
        rank.start()
    pid = os.fork()
    if pid == 0:
        try:
            _stamp_and_exit(2, out)
        finally:
            os._exit(0)
    for rank in ranks:
        rank.join(30)
    os.waitpid(pid, 0)
    return list(_gate["fork_times"])  # type: ignore[call-overload]


def test_plain_forks_start_after_the_quiet_period_only_beside_a_store(two, gate, tmp_path,
                                                                     monkeypatch):
    import torch.distributed as dist

    _gate["held"] = None
    monkeypatch.setattr(quiet_window, "QUIET", 2.0)
    assert not fork_hazard.store_thread_running()
    (tmp_path / "alone").mkdir()
    forked = _fork_three(str(tmp_path / "alone"))
    starts = [float(p.read_text()) for p in (tmp_path / "alone").iterdir()]
    assert len(starts) == 3 and max(starts) < max(forked) + 2.0  # not held: no store thread

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        assert fork_hazard.store_thread_running()  # torch 2.13's thread: pt_tcpstore_uv
        _gate["fork_times"] = []
        (tmp_path / "store").mkdir()
        forked = _fork_three(str(tmp_path / "store"))
        starts = [float(p.read_text()) for p in (tmp_path / "store").iterdir()]
        assert len(starts) == 3 and min(starts) >= max(forked) + 2.0
    finally:
        del store
    deadline = time.monotonic() + 5
    while quiet_window._quiet is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert quiet_window._quiet is None  # the window closed: its descriptors are gone


def _waits_forever() -> None:
    threading.Event().wait()  # the plain fork's line the report must show


def test_a_hung_plain_fork_beside_a_store_is_reported(two, hang_timeout, capfd):
    import torch.distributed as dist

    hang_timeout(2)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        start = time.monotonic()
        rank = _fork.Process(target=_waits_forever)
        rank.start()
        rank.join(30)
        took = time.monotonic() - start
    finally:
        del store
    err = capfd.readouterr().err
    assert rank.exitcode == hang_report.HANG_EXIT, (rank.exitcode, err)
    assert 2 <= took < 15, took
    assert "no process of this launch made progress for 2 s" in err, err
    assert "threading.Event().wait()  # the plain fork's line the report must show" in err


def test_a_hung_plain_fork_is_reported_while_the_parent_idles_with_background_threads(
        two, hang_timeout, capfd):
    """A waiting parent's own threads (a store's, the register's, here one that computes 3 % of
    the time) cross a clock tick now and then: that is not a parent computing for its pool, and
    the child that waits for ever is still reported."""
    import torch.distributed as dist

    hang_timeout(2)
    stop = threading.Event()

    def background() -> None:
        while not stop.wait(0.02):
            end = time.thread_time() + 0.0006
            while time.thread_time() < end:
                pass

    thread = threading.Thread(target=background, daemon=True)
    thread.start()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    rank = _fork.Process(target=_waits_forever)
    try:
        rank.start()
        rank.join(30)
    finally:
        stop.set()
        thread.join()
        if rank.is_alive():  # not reported: do not leave it waiting for ever
            rank.kill()
            rank.join()
        del store
    err = capfd.readouterr().err
    assert rank.exitcode == hang_report.HANG_EXIT, (rank.exitcode, err)
    assert "no process of this launch made progress for 2 s" in err, err


def test_dataloader_workers_beside_a_store_are_not_reported(two, hang_timeout, capfd):
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    hang_timeout(1)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        loader = DataLoader(list(range(4)), batch_size=2, num_workers=2,
                            persistent_workers=True, multiprocessing_context="fork")
        first = [b.tolist() for b in loader]
        time.sleep(3)  # the parent idle, the workers idle: longer than the hang timeout
        second = [b.tolist() for b in loader]
        del loader
    finally:
        del store
    assert first == second == [[0, 1], [2, 3]]
    assert "made progress" not in capfd.readouterr().err
    assert torch.utils.data.get_worker_info() is None


# -- spawned ranks ----------------------------------------------------------------------------


def _spawned_pair(i: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=i, world_size=2)
    if i == 1:
        threading.Event().wait()  # spawned rank 1 never joins the collective
    dist.all_reduce(torch.ones(1))  # spawned rank 0 waits here


def test_a_hung_spawned_pair_is_reported(two, hang_timeout, capfd, tmp_path, monkeypatch):
    import tempfile

    hang_timeout(5)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the slots file goes
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    start = time.monotonic()
    with pytest.raises(mp.ProcessExitedException, match="terminated with exit code 124"):
        mp.spawn(_spawned_pair, args=(port,), nprocs=2)
    took = time.monotonic() - start
    err = capfd.readouterr().err
    assert 5 <= took < 60, took
    assert "no process of this launch made progress for 5 s" in err, err
    assert "process 1 of the launch" in err
    assert "threading.Event().wait()  # spawned rank 1 never joins the collective" in err
    assert "dist.all_reduce(torch.ones(1))  # spawned rank 0 waits here" in err, err
    # the slots file is gone with the launch (torch's own error files stay, as torch leaves them)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("devlab-hang-")] == []


def test_a_killed_parents_slots_file_is_swept_by_the_next_launch(tmp_path, monkeypatch) -> None:
    # See Note [The slots file of a launch whose parent was killed] in fork_safety/hang_report.py
    import subprocess
    import tempfile

    from devlab.engine.simulated.torch_distributed.fork_safety import hang_report

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = tmp_path / f"devlab-hang-{int(gone.stdout)}-abc123"  # a SIGKILLed parent's
    dead.write_bytes(b"\0" * 16)
    other = tmp_path / "devlab-hang-notapid"  # not a launch's name: left alone
    other.write_bytes(b"")
    path = hang_report._slots_file(2)
    try:
        assert os.path.basename(path).startswith(f"devlab-hang-{os.getpid()}-")
        assert not dead.exists() and other.exists()
        again = hang_report._slots_file(2)  # this process's own file survives the next sweep
        assert os.path.exists(path) and os.path.exists(again)
        os.unlink(again)
    finally:
        os.unlink(path)


def _waits_for_the_parent(ready: Any) -> None:
    ready.wait(30)  # idle while the parent computes: a pool's worker waiting for work


def test_a_plain_fork_waiting_for_a_busy_parent_is_not_reported(two, hang_timeout, capfd):
    import torch.distributed as dist

    hang_timeout(1)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        ready = _fork.Event()
        worker = _fork.Process(target=_waits_for_the_parent, args=(ready,))
        worker.start()
        end = time.monotonic() + 3
        while time.monotonic() < end:  # the parent computes for three hang timeouts
            sum(range(1000))
        ready.set()
        worker.join(30)
    finally:
        del store
    assert worker.exitcode == 0, capfd.readouterr().err
    assert "made progress" not in capfd.readouterr().err
