"""Every modeled board answers NVML and nvidia-smi: its published NVML total, consistent with
the memory torch reports, and its driver's name (issue 40's boards included)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import devlab
from devlab.engine.gpu_model.capacity import (
    NVML_IS_CUDAS,
    NVML_TOTAL_MIB,
    TOTAL_MEMORY,
    nvml_total_memory,
    total_memory,
)
from devlab.engine.gpu_model.specs import gpu
from devlab.engine.simulated.base import machine
from devlab.engine.simulated.instruments import nvidia_smi, nvml_answers

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024
BOARDS = sorted(TOTAL_MEMORY)


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    """A machine of this test's own, apart from other tests' simulations."""
    k = f"test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv(machine.ENV, k)
    return k


def test_every_board_has_an_nvml_total_consistent_with_torchs() -> None:
    """NVML counts the memory torch sees and what the driver keeps apart, and never more than
    the board's DRAM: no reserve below zero (an idle board's NVML "used" would wrap), and the
    published tables' totals are all between 93 % and 100 % of the datasheet's memory in GiB
    (ECC's sixteenth on GDDR: the T4's 15360 of 16384 MiB, 93.75 %; the L4, A10G and L40S
    93.7 %; HBM boards and GeForce cards 98.5-100 %)."""
    assert set(NVML_TOTAL_MIB) == set(TOTAL_MEMORY)
    assert set(nvml_answers.BOARD_NAMES) == set(TOTAL_MEMORY)  # each board's driver name
    for name in BOARDS:
        spec = gpu(name)
        nvml, cuda = nvml_total_memory(spec), total_memory(spec)
        assert nvml // MiB == NVML_TOTAL_MIB[name], name  # what nvidia-smi prints, floored
        if name in NVML_IS_CUDAS:
            assert nvml == cuda, name
        else:
            assert nvml > cuda, (name, nvml - cuda)
        share = NVML_TOTAL_MIB[name] / (spec.memory_gb * 1024)
        assert 0.93 <= share <= 1.0, (name, share)


def _fresh_pynvml():
    sys.modules.pop("pynvml", None)
    import pynvml

    return pynvml


def test_every_board_answers_nvml_and_nvidia_smi(no_simulation, key) -> None:
    """For each board: pynvml's name and memory (versions 1 and 2) on a simulated one, and
    nvidia-smi's default table, `-L` and a query on its NVML view, without an error."""
    pynvml = _fresh_pynvml()
    for name in BOARDS:
        spec = gpu(name)
        devlab.config.simulate_gpus(1, model=name)
        try:
            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            assert pynvml.nvmlDeviceGetName(h) == nvml_answers.BOARD_NAMES[name]
            v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
            v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            assert v1.total == v2.total == nvml_total_memory(spec), name
            # An idle board: version 1's used is the driver's reserve, free what CUDA offers.
            assert (v1.used, v1.free) == (v2.reserved, total_memory(spec)), name
            assert v1.used + v1.free == v1.total and v2.used == 0, name
            pynvml.nvmlShutdown()
        finally:
            devlab.simulated.stop()

        d = nvml_answers.Description(key, 1, name, None, [None], 64 * 1024 * MiB)
        view = nvml_answers.view_from(d, [])
        board = nvml_answers.BOARD_NAMES[name]
        status, out, err = nvidia_smi.run([], view)
        assert status == 0 and not err, (name, err)
        assert f"0MiB / {NVML_TOTAL_MIB[name]:>6}MiB" in out and board in out, out
        status, out, err = nvidia_smi.run(["-L"], view)
        assert status == 0 and out.startswith(f"GPU 0: {board} (UUID: GPU-"), (name, out, err)
        status, out, err = nvidia_smi.run(
            ["--query-gpu=name,memory.total,memory.used,memory.free",
             "--format=csv,noheader,nounits"], view)
        assert status == 0, (name, err)
        assert [c.strip() for c in out.strip().split(",")] == [
            board, str(NVML_TOTAL_MIB[name]), "0", str(total_memory(spec) // MiB)], name


def test_a_new_board_through_the_environment_devlab_run_and_devices(key, tmp_path) -> None:
    """DEVLAB_SIMULATE_GPU_MODEL=L40S under `devlab run`: torch, pynvml, the simulated
    nvidia-smi on the PATH and `%devices` all see the L40S."""
    script = textwrap.dedent("""
        import subprocess, pynvml, torch
        from IPython.core.interactiveshell import InteractiveShell
        x = torch.ones(1024, 1024, device="cuda")
        print("torch", torch.cuda.get_device_properties(0).total_memory)
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        print("nvml", pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetMemoryInfo(h).total)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True)
        print("smi", smi.returncode, smi.stdout.strip(), smi.stderr.strip())
        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "devlab")
        print("devices", shell.run_line_magic("devices", "").text().splitlines()[-2])
    """)
    (tmp_path / "board.py").write_text(script)
    env = {**os.environ, "DEVLAB_SIMULATE_GPU_MODEL": "L40S", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "devlab", "run", "--simulate-gpus", "1",
                           str(tmp_path / "board.py")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines()
            if line.split(" ", 1)[0] in {"torch", "nvml", "smi", "devices"}}
    assert said["torch"] == str(TOTAL_MEMORY["L40S"])
    assert said["nvml"] == f"NVIDIA L40S {NVML_TOTAL_MIB['L40S'] * MiB}"
    assert said["smi"].strip() == "0 NVIDIA L40S, 46068 MiB"  # status, table, no error
    assert "cuda:0" in said["devices"] and "simulated, modeled L40S" in said["devices"]
    assert "44.4 GiB" in said["devices"]  # torch's total, 45496 MiB
