"""NVML (pynvml) and nvidia-smi on simulated GPUs, and the machine's register they read."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import torch

import devlab
from devlab.engine.gpu_model.caching_allocator import format_size
from devlab.engine.gpu_model.capacity import CONTEXT_BYTES, NVML_TOTAL_MIB, TOTAL_MEMORY
from devlab.engine.simulated.base import machine

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024

# A child that imports the register without devlab's package (or torch), as nvidia-smi does:
# the packages above it stubbed over their folders (read from the modules, wherever they are).
_PARENTS = machine.__spec__.name.split(".")[:-1]
_STUBS = textwrap.dedent(f"""
    import importlib, sys, types
    for n, p in {[(".".join(_PARENTS[:i]), list(sys.modules[".".join(_PARENTS[:i])].__path__))
                  for i in range(1, len(_PARENTS) + 1)]!r}:
        m = types.ModuleType(n); m.__path__ = p; sys.modules[n] = m
    machine = importlib.import_module({machine.__spec__.name!r})
""")


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    """A group of machines of this test's own (other tests' and kernels' simulations stay
    apart); the register's tests use its name as their machine's key."""
    k = f"test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv(machine.ENV, k)
    yield k
    left = [n for n in os.listdir(os.path.dirname(machine.directory(k))) if k in n]
    assert not left, "the register outlived its processes"


def _child(k: str, used: dict[int, int]) -> subprocess.Popen:
    code = _STUBS + textwrap.dedent(f"""
        import time
        p = machine.publish({k!r}, lambda: machine.Usage({used!r}, {{}}))
        p.flush()
        print("ready", flush=True)
        time.sleep(120)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def _wait_until(predicate, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_two_processes_see_each_others_memory_and_nothing_stays(key):
    child = _child(key, {0: 300 * MiB, 1: 0})
    try:
        mine = machine.publish(key, lambda: machine.Usage({0: 5 * MiB, 1: 7 * MiB}, {}))
        mine.flush()
        seen = {e.pid: e.used for e in machine.entries(key)}
        assert seen[child.pid] == {0: 300 * MiB, 1: 0}
        assert seen[os.getpid()] == {0: 5 * MiB, 1: 7 * MiB}
        assert machine.others_on_gpu(0, key) == [(child.pid, 300 * MiB)]
        assert machine.others_on_gpu(1, key) == []  # the child holds nothing there
        machine.unpublish(mine)
        assert [e.pid for e in machine.entries(key)] == [child.pid]
    finally:
        child.terminate()  # SIGTERM: Python's default handler exits without atexit
        child.wait(timeout=30)
    # Gone without its atexit: the watcher cleaned after it; readers sweep in any case.
    assert _wait_until(lambda: not os.path.exists(machine.directory(key)))


def test_a_sigkilled_process_is_swept_even_if_nobody_reads(key):
    child = _child(key, {0: 123 * MiB})
    path = machine.directory(key)
    assert os.listdir(path) == [f"{child.pid}.json"]
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    # Nobody reads the register: the child's watcher removes its file and the folder.
    assert _wait_until(lambda: not os.path.exists(path))


def test_a_reader_sweeps_a_file_whose_process_is_gone(key, tmp_path):
    path = machine.directory(key)
    os.makedirs(path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    Path(path, f"{pid}.json").write_text(f'{{"pid": {pid}, "used": {{"0": 1}}}}')
    assert machine.entries(key) == []
    assert not os.path.exists(path)


# --------------------------------------------------------------------------------------------
# pynvml


def _fresh_pynvml():
    sys.modules.pop("pynvml", None)
    return importlib.import_module("pynvml")


@pytest.mark.parametrize("imported", ["before", "after"])
def test_pynvml_answers_for_the_modeled_t4(no_simulation, key, imported):
    if imported == "before":
        pynvml = _fresh_pynvml()
    else:
        sys.modules.pop("pynvml", None)  # a program that imports it once GPUs are simulated
    devlab.config.simulate_gpus(2, model="T4")
    try:
        if imported == "after":
            assert "pynvml" not in sys.modules
            pynvml = importlib.import_module("pynvml")
        original = None  # no driver here: pynvml never loaded a library
        x = torch.ones(1000, 1000, device="cuda:0")
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == 2
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetName(h) == "Tesla T4"
        assert pynvml.nvmlDeviceGetCudaComputeCapability(h) == torch.cuda.get_device_capability(0)
        free, total = torch.cuda.mem_get_info(0)
        v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        assert v2.total == NVML_TOTAL_MIB["T4"] * MiB == 16_106_127_360
        assert total == TOTAL_MEMORY["T4"]
        # Used: what this process holds (context + reserved), as cudaMemGetInfo counts it.
        assert v2.used == total - free > torch.cuda.memory_reserved(0)
        assert v2.reserved == v2.total - total
        v1 = pynvml.nvmlDeviceGetMemoryInfo(h)  # version 1 counts the driver's reserve as used
        assert (v1.used, v1.free) == (v2.used + v2.reserved, free)
        assert v1.used + v1.free == v1.total
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        assert [(p.pid, p.usedGpuMemory) for p in procs] == [(os.getpid(), v2.used)]
        h1 = pynvml.nvmlDeviceGetHandleByIndex(1)
        assert pynvml.nvmlDeviceGetComputeRunningProcesses(h1) == []  # cuda:1 never used
        uid = pynvml.nvmlDeviceGetUUID(h1)
        assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uid)) == 1
        bus = pynvml.nvmlDeviceGetPciInfo(h1).busId
        assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId(bus)) == 1
        # The default machine of two T4s stages peer traffic through host memory.
        assert (pynvml.nvmlDeviceGetP2PStatus(h, h1, pynvml.NVML_P2P_CAPS_INDEX_READ)
                == pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED)
        assert (pynvml.nvmlDeviceGetTopologyCommonAncestor(h, h1)
                == pynvml.NVML_TOPOLOGY_HOSTBRIDGE)
        assert 0 <= pynvml.nvmlDeviceGetUtilizationRates(h).gpu <= 100
        assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 70_000  # the datasheet's 70 W
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetPowerUsage(h)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(2)
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
        pynvml.nvmlShutdown()
        del x
    finally:
        devlab.simulated.stop()
    # Unsimulated, pynvml is its own again: the very library object it had (or none).
    assert pynvml.nvmlLib is original
    with pytest.raises(pynvml.NVMLError):
        pynvml.nvmlInit()  # no driver here


def test_nvlink_machines_answer_peer_to_peer_over_nvlink(no_simulation, key):
    pynvml = _fresh_pynvml()
    devlab.config.simulate_gpus(2, model="A100-80GB")  # an NVSwitch server by default
    try:
        pynvml.nvmlInit()
        a, b = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
        assert (pynvml.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                == pynvml.NVML_P2P_STATUS_OK)
        r = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        row = next(line for line in r.stdout.splitlines() if line.startswith("GPU0\t"))
        assert row.split("\t")[1:3] == [" X ", "NV12"]
    finally:
        devlab.simulated.stop()


def test_the_memory_reader_draws_nvmls_used_line(no_simulation, key):
    devlab.config.simulate_gpus(1, model="T4")
    try:
        torch.ones(10, device="cuda")
        reading = devlab.memory.reader_for("cuda:0").read()
        free, total = torch.cuda.mem_get_info(0)
        assert reading.driver_used == total - free  # the context is in NVML's line
        assert reading.reserved < reading.driver_used
    finally:
        devlab.simulated.stop()


def test_devlabs_reader_of_real_gpus_sees_none_while_simulating(no_simulation, key):
    from devlab.engine import nvml_reader as nvml

    _fresh_pynvml()
    devlab.config.simulate_gpus(1, model="T4")
    try:
        assert nvml.device_count() == 0
        assert nvml.memory_info(0) is None
    finally:
        devlab.simulated.stop()


# --------------------------------------------------------------------------------------------
# nvidia-smi


def _smi(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=120)


def test_nvidia_smi_prints_nvmls_numbers(no_simulation, key):
    devlab.config.simulate_gpus(2, model="T4")
    try:
        x = torch.ones(2000, 2000, device="cuda:1")
        free, total = torch.cuda.mem_get_info(1)
        used_mib = (total - free) // MiB

        def csv():
            r = _smi("--query-gpu=index,name,memory.total,memory.used,memory.free",
                     "--format=csv,noheader,nounits")
            assert r.returncode == 0, r.stderr
            return [[c.strip() for c in line.split(",")] for line in r.stdout.splitlines()]

        # The kernel's entry is written within the register's interval.
        assert _wait_until(lambda: csv()[1][3] == str(used_mib))
        rows = csv()
        # An unused GPU: nothing used, free what CUDA offers (NVML's total less the driver's).
        assert rows[0] == ["0", "Tesla T4", "15360", "0", str(total // MiB)]
        assert rows[1][:3] == ["1", "Tesla T4", "15360"]
        assert int(rows[1][4]) == (total - (total - free)) // MiB == free // MiB

        r = _smi("--query-gpu=memory.used,utilization.gpu,temperature.gpu", "--format=csv")
        header, *lines = r.stdout.splitlines()
        assert header == "memory.used [MiB], utilization.gpu [%], temperature.gpu"
        assert lines[1].startswith(f"{used_mib} MiB, ") and lines[1].endswith(", [N/A]")

        apps = _smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
        assert apps.stdout.split() == [f"{os.getpid()},", str(used_mib)]

        table = _smi().stdout
        assert "simulated" in table.splitlines()[0]
        assert f"{used_mib}MiB /  15360MiB" in table and "Tesla T4" in table
        assert any(line.split()[1:2] == ["1"] and str(os.getpid()) in line
                   and line.rstrip(" |").endswith(f"{used_mib}MiB") for line in table.splitlines())

        listed = _smi("-L").stdout.splitlines()
        assert [line.split(" (UUID")[0] for line in listed] == ["GPU 0: Tesla T4",
                                                               "GPU 1: Tesla T4"]
        only = _smi("-i", "1", "--query-gpu=index", "--format=csv,noheader")
        assert only.stdout.split() == ["1"]

        bad = _smi("--bogus")
        assert bad.returncode != 0
        assert "'--bogus'" in bad.stderr and "--query-gpu" in bad.stderr
        field = _smi("--query-gpu=memory.bogus", "--format=csv")
        assert field.returncode != 0 and '"memory.bogus"' in field.stderr
        del x
    finally:
        launcher = os.environ["PATH"].split(os.pathsep)[0]
        devlab.simulated.stop()
    assert not os.path.exists(launcher), "the nvidia-smi launcher outlived the simulation"
    assert launcher not in os.environ["PATH"]


@pytest.mark.parametrize("model", ["T4", None])
def test_torch_nvml_and_nvidia_smi_name_each_gpu_alike(no_simulation, key, monkeypatch, model):
    # On a real GPU torch's uuid is NVML's without "GPU-", and its pci_bus_id NVML's bus.
    pynvml = _fresh_pynvml()
    seen = {}
    for group in (key, key + "-other"):  # another machine: other boards, other UUIDs
        monkeypatch.setenv(machine.ENV, group)
        devlab.config.simulate_gpus(2, model=model)
        try:
            pynvml.nvmlInit()
            smi = _smi("--query-gpu=index,uuid,pci.bus_id,name", "--format=csv,noheader")
            assert smi.returncode == 0, smi.stderr
            listed = [[c.strip() for c in line.split(",")] for line in smi.stdout.splitlines()]
            for i in range(2):
                p = torch.cuda.get_device_properties(i)
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                name = name.decode() if isinstance(name, bytes) else name
                assert listed[i].pop() == name
                if model is None:  # no board: one name everywhere, as a real board's
                    assert name == torch.cuda.get_device_name(i) == p.name == (
                        "Simulated GPU (CPU-backed)")
                else:  # NVML names the board; torch says it is a simulated one of them
                    assert name == "Tesla T4"
                    assert torch.cuda.get_device_name(i) == "Simulated GPU (modeled T4, CPU-backed)"
                assert pynvml.nvmlDeviceGetUUID(h) == f"GPU-{p.uuid}"
                bus = pynvml.nvmlDeviceGetPciInfo(h).busId
                bus = bus.decode() if isinstance(bus, bytes) else bus
                assert int(bus.split(":")[1], 16) == p.pci_bus_id == i + 1
                assert listed[i] == [str(i), f"GPU-{p.uuid}", bus]
            seen[group] = [str(torch.cuda.get_device_properties(i).uuid) for i in range(2)]
            pynvml.nvmlShutdown()
        finally:
            devlab.simulated.stop()
    first, second = seen.values()
    assert len({*first, *second}) == 4


def test_a_second_process_on_the_machine_sees_the_first(no_simulation, key):
    devlab.config.simulate_gpus(1, model="T4")
    try:
        torch.ones(10, device="cuda")
        free, total = torch.cuda.mem_get_info(0)
        code = textwrap.dedent("""
            import os, torch, pynvml
            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            torch.ones(10, device="cuda")
            import time; time.sleep(0.3)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                print(p.pid, p.usedGpuMemory)
        """)
        env = dict(os.environ, DEVLAB_SIMULATE_GPUS="1", DEVLAB_SIMULATE_GPU_MODEL="T4",
                   PYTHONPATH=str(ROOT))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        seen = dict(line.split() for line in r.stdout.splitlines())
        assert seen[str(os.getpid())] == str(total - free)  # the kernel, from the child
        assert len(seen) == 2  # and the child itself
    finally:
        devlab.simulated.stop()


def test_the_out_of_memory_message_names_the_other_processes_on_the_gpu(no_simulation, key):
    """CUDA's text, as torch's reportProcessMemoryInfo writes it: this process in its own words,
    each other process on the GPU (here a child holding a block) by its pid and NVML's bytes."""
    devlab.config.simulate_gpus(1, model="T4")
    try:
        torch.ones(10, device="cuda")
        code = textwrap.dedent("""
            import torch, time
            x = torch.ones(64, 1024, 1024, device="cuda")  # 256 MiB
            print("ready", flush=True)
            time.sleep(120)
        """)
        env = dict(os.environ, DEVLAB_SIMULATE_GPUS="1", DEVLAB_SIMULATE_GPU_MODEL="T4",
                   PYTHONPATH=str(ROOT))
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                 text=True, env=env)
        try:
            assert child.stdout.readline().strip() == "ready"
            # Its CUDA context is published first, then its block beside it.
            assert _wait_until(lambda: sum(b for _, b in machine.others_on_gpu(0)) > 256 * MiB)
            (pid, used), = machine.others_on_gpu(0)
            assert pid == child.pid
            with pytest.raises(torch.OutOfMemoryError) as e:
                torch.empty(64 * 1024 * MiB, dtype=torch.uint8, device="cuda")
            text = str(e.value)
            assert "Including non-PyTorch memory, this process has " in text
            assert f"Process {os.getpid()} has" not in text  # this process is not "another"
            assert f"Process {child.pid} has {format_size(used)} memory in use." in text
        finally:
            child.kill()
            child.wait()
    finally:
        devlab.simulated.stop()


def _ranks_see_each_other() -> tuple[int, dict[int, list[int]]]:
    import time

    import pynvml
    import torch.distributed as dist

    dist.init_process_group("nccl")  # devlab.launch set the rendezvous up
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    torch.ones(1000, device="cuda")
    dist.barrier()
    time.sleep(0.5)  # each rank's register entry is written within 50 ms of a change
    pynvml.nvmlInit()
    seen = {i: [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(
        pynvml.nvmlDeviceGetHandleByIndex(i))] for i in range(pynvml.nvmlDeviceGetCount())}
    dist.barrier()  # no rank leaves before the other has looked
    dist.destroy_process_group()
    return os.getpid(), seen


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_every_rank_sees_every_ranks_process(no_simulation, key, method):
    devlab.config.simulate_gpus(2, model="T4")
    try:
        (pid0, seen0), (pid1, seen1) = devlab.launch(_ranks_see_each_other, nprocs=2,
                                                     start_method=method, timeout=240)
        assert seen0 == seen1 == {0: [pid0], 1: [pid1]}
    finally:
        devlab.simulated.stop()


def test_a_second_kernel_simulating_the_same_machine_sees_this_process(no_simulation,
                                                                        monkeypatch):
    """Two programs that simulate the same machine (here 3 TITAN RTX) share it by default, as
    two kernels on one GPU server do: nvidia-smi and pynvml in the kernel list this process."""
    from nbutil import run_cells, stream, text

    from devlab.engine.simulated import instruments

    monkeypatch.delenv(machine.ENV, raising=False)
    devlab.config.simulate_gpus(3, model="TITAN-RTX")
    try:
        assert os.environ[machine.ENV] == machine.DEFAULT_GROUP
        assert instruments.key() == "shared-3xTITAN-RTX"
        torch.ones(1000, device="cuda:2")
        free, total = torch.cuda.mem_get_info(2)
        setup, smi, nvml = run_cells(
            "import os, torch, pynvml, devlab\n"
            "devlab.config.simulate_gpus(3, model='TITAN-RTX')\n"
            "x = torch.ones(1000, 1000, device='cuda:0')\n"
            "print(os.getpid())",
            "!nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory "
            "--format=csv,noheader,nounits",
            "pynvml.nvmlInit()\n"
            "for i in range(pynvml.nvmlDeviceGetCount()):\n"
            "    h = pynvml.nvmlDeviceGetHandleByIndex(i)\n"
            "    print(i, [(p.pid, p.usedGpuMemory)\n"
            "             for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)])",
            env={machine.ENV: ""}, allow_errors=False, timeout=300)
        kernel = int(stream(setup).strip())
        apps = [[c.strip() for c in line.split(",")] for line in text(smi).splitlines()]
        assert [(int(pid), bus) for pid, bus, _ in apps] == [
            (kernel, "00000000:01:00.0"), (os.getpid(), "00000000:03:00.0")]
        assert int(apps[1][2]) == (total - free) // MiB
        lines = text(nvml).splitlines()
        assert lines[1] == "1 []"
        assert lines[2] == f"2 [({os.getpid()}, {total - free})]"
        assert lines[0].startswith(f"0 [({kernel}, ")
    finally:
        devlab.simulated.stop()


def _fake_nvidia_smi(folder: Path, listing: str, status: int) -> None:
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '{listing}\\n'\necho \"real: $*\"\nexit {status}\n")
    script.chmod(0o755)


def _list_on_a_t4_with_first_on_path(folder: Path, monkeypatch) -> subprocess.CompletedProcess:
    """`nvidia-smi -L` on one simulated T4, with `folder` first on the PATH."""
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    devlab.config.simulate_gpus(1, model="T4")
    try:
        return _smi("-L")
    finally:
        devlab.simulated.stop()


@pytest.mark.parametrize(("listing", "status", "real_runs"), [
    ("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-x)", 0, True),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9, False),
])
def test_a_real_nvidia_smi_that_lists_gpus_runs_instead(no_simulation, key, tmp_path,
                                                        monkeypatch, listing, status,
                                                        real_runs):
    _fake_nvidia_smi(tmp_path, listing, status)
    r = _list_on_a_t4_with_first_on_path(tmp_path, monkeypatch)
    if real_runs:
        assert r.stdout.splitlines()[-1] == "real: -L"  # the real one, with the arguments
    else:
        assert r.stdout.startswith("GPU 0: Tesla T4 (UUID: GPU-"), r.stdout


def test_another_simulating_process_launcher_is_never_taken_for_a_real_one(no_simulation, key,
                                                                            tmp_path, monkeypatch):
    """A simulating child's PATH holds its parent's launcher too (a rank a kernel forks): that
    one is a launcher, not a real nvidia-smi, and is not run, even to ask it `-L` (two launchers
    had probed each other without end, a process each time)."""
    from devlab.engine.simulated.instruments import nvidia_smi

    probed = tmp_path / "probed"
    (tmp_path / "nvidia-smi").write_text(
        f"#!/bin/sh\n{nvidia_smi.SHIM_MARK} (removed when they stop)\n"
        f"touch {probed}\necho 'GPU 0: a parent launcher (UUID: GPU-p)'\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    r = _list_on_a_t4_with_first_on_path(tmp_path, monkeypatch)
    assert r.stdout.startswith("GPU 0: Tesla T4 (UUID: GPU-"), r.stdout
    assert not probed.exists()


def test_the_table_keeps_the_real_layout_for_any_board():
    """A pure function of NVML's view: every line of the board table as wide as the real one's
    (driver 550: 91 characters), whatever the names and figures."""
    from devlab.engine.simulated.instruments import nvidia_smi, nvml_answers

    for model in ("T4", "A100-80GB", "H100", None):
        d = nvml_answers.Description("k", 2, model, None, [None, 512 * MiB], 64 * 1024 * MiB)
        long_name = "/opt/conda/envs/a-very-long-environment-name/bin/python3.11 train.py"
        entries = [machine.Entry(4242, long_name, {0: 1234 * MiB, 1: 5 * MiB}, {0: 37}, 0.0)]
        view = nvml_answers.view_from(d, entries)
        out = nvidia_smi.table(view, now="Tue Dec  1 00:00:00 2026")
        lines = out.splitlines()
        body = [ln for ln in lines[2:] if ln.strip()]
        assert {len(ln) for ln in body} == {nvidia_smi.WIDTH + 2}, out
        assert f"{1234}MiB" in out and "4242" in out
        assert ("37%" in out) == (model is not None)  # utilization needs a modeled clock
        status, _, err = nvidia_smi.run(["-q"], view)
        assert status == 2 and "'-q'" in err and "--query-gpu" in err


# docs/nvml-validation.md, "After loading a model": transformers' "Model training anatomy"
# printed 1343 MB after `torch.ones((1, 1)).to("cuda")` and 2631 MB after bert-large-uncased's
# `.to("cuda")` on a V100-SXM2 16 GB. The first figure is CUDA 11.2's eager context, which the
# modeled (lazy) context is not; the model's part, the difference, is what the doc compares,
# within 2 MiB (each printed figure is floored to a MiB).
_ANATOMY = ROOT / "benchmarks" / "data" / "nvml_published" / "model_memory_anatomy.py"
_ANATOMY_PUBLISHED_MIB = (0, 1343, 2631)


def test_the_model_training_anatomy_docs_model_takes_what_it_took_on_a_v100(key):
    pytest.importorskip("transformers")  # the compatibility jobs leave the frameworks out
    env = {**os.environ, "DEVLAB_SIMULATE_GPU_MODEL": "V100-SXM2-16GB", "PYTHONPATH": str(ROOT)}
    # Through `devlab run` (the start-up hook's way, NVML asked before torch, is
    # tests/test_autostart.py's test_nvml_asked_before_torch_is_imported).
    proc = subprocess.run([sys.executable, "-m", "devlab", "run", "--simulate-gpus", "1",
                           str(_ANATOMY)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [int(line.split()[-2]) for line in proc.stdout.splitlines()
               if line.startswith("GPU memory occupied: ")]
    assert len(printed) == 3, proc.stdout
    idle, first, loaded = printed
    # Idle and after the first tensor: NVML's version-1 used, the driver's reserve (NVML's
    # total less CUDA's) and then the modeled context and the tensor's 2 MiB segment.
    reserve = NVML_TOTAL_MIB["V100-SXM2-16GB"] * MiB - TOTAL_MEMORY["V100-SXM2-16GB"]
    assert idle == reserve // MiB
    assert first == (reserve + CONTEXT_BYTES + 2 * MiB) // MiB
    published = _ANATOMY_PUBLISHED_MIB[2] - _ANATOMY_PUBLISHED_MIB[1]  # 1288 MiB of weights
    assert abs((loaded - first) - published) <= 2, (loaded - first, published)


def _ddp_without_set_device() -> tuple[int, int, int, dict[int, dict[int, int]]]:
    import time

    import pynvml
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    model = torch.nn.Linear(10, 10).to(f"cuda:{rank}")  # no torch.cuda.set_device(rank)
    DistributedDataParallel(model, device_ids=[rank])
    dist.barrier()
    time.sleep(0.5)  # each rank's register entry is written within 50 ms of a change
    pynvml.nvmlInit()
    seen = {i: {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(
        pynvml.nvmlDeviceGetHandleByIndex(i))} for i in range(pynvml.nvmlDeviceGetCount())}
    dist.barrier()
    dist.destroy_process_group()
    return rank, os.getpid(), torch.cuda.memory_reserved(0), seen


def test_a_rank_without_set_device_holds_a_context_and_nccls_buffers_on_gpu_0(no_simulation,
                                                                              key):
    # docs/nvml-validation.md, "Per process in a DDP job" (pytorch/pytorch#114765): DDP's
    # parameter check makes rank 1's NCCL communicator on the current device, GPU 0, where
    # nvidia-smi then lists rank 1 although torch.cuda.memory_reserved(0) is 0.
    from devlab.engine.gpu_model.capacity import nccl_buffer_bytes

    devlab.config.simulate_gpus(2, model="T4")
    try:
        results = devlab.launch(_ddp_without_set_device, nprocs=2, start_method="fork",
                                timeout=240)
    finally:
        devlab.simulated.stop()
    (_, pid0, _, seen), (rank1, pid1, reserved0, _) = sorted(results)
    assert rank1 == 1 and reserved0 == 0
    assert seen[0][pid1] == CONTEXT_BYTES + nccl_buffer_bytes(2, "PCI")  # 272 MiB on a T4 pair
    assert set(seen[1]) == {pid1} and seen[1][pid1] > CONTEXT_BYTES  # its own GPU: the model
    assert pid0 in seen[0]
