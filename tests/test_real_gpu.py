"""A machine with real GPUs (Colab's GPU runtime has one), faked at the boundary.

No GPU exists where these tests run, so torch.cuda's device queries and the NVML library
(`pynvml`, what devlab.nvml calls) answer as a driver with `n` GPUs would. What is tested is
devlab's own logic on top: simulated GPUs are refused beside real ones with words that say
what to do, the environment switch is ignored with a warning, and a lesson that needs more
GPUs than there are says plainly what will not run.
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Callable

import pytest
import torch

from devlab import config, nvml, simulated
from devlab.lesson import needs_gpus, shortfall_message

T4_MEMORY = 15 * 1024**3


def fake_pynvml(count: int) -> types.ModuleType:
    """The part of pynvml devlab uses, as the driver of a machine with `count` Tesla T4s."""
    mod = types.ModuleType("pynvml")

    def handle(i: int) -> int:
        if not 0 <= i < count:
            raise RuntimeError(f"NVML: invalid index {i}")
        return i

    mod.nvmlInit = lambda: None
    mod.nvmlDeviceGetCount = lambda: count
    mod.nvmlDeviceGetHandleByIndex = handle
    mod.nvmlDeviceGetName = lambda h: b"Tesla T4"
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=300 * 2**20, total=T4_MEMORY)
    mod.nvmlDeviceGetCudaComputeCapability = lambda h: (7, 5)
    mod.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=b"00000000:00:04.0")
    mod.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    mod.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=0)
    mod.nvmlDeviceGetComputeRunningProcesses = lambda h: []
    return mod


@pytest.fixture
def real_gpus(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """Make torch.cuda and NVML report `n` real GPUs for the rest of the test."""

    def install(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(n))
        nvml._nvml.cache_clear()

    yield install
    nvml._nvml.cache_clear()  # forget the fake driver before the next test


def test_the_fake_machine_looks_like_a_colab_gpu_runtime(real_gpus) -> None:
    real_gpus(1)
    gpus = config.list_physical_devices("GPU")
    assert [(g.name, g.simulated) for g in gpus] == [("/physical_device:GPU:0", False)]
    assert config.get_device_details(gpus[0])["device_name"] == "Tesla T4"
    assert config.gpu_status().startswith("1 CUDA GPU ")


def test_simulate_gpus_refuses_beside_a_real_gpu_and_says_what_to_do(real_gpus) -> None:
    real_gpus(1)
    with pytest.raises(RuntimeError) as refused:
        config.simulate_gpus(2)
    words = str(refused.value)
    assert "1 real GPU," in words
    assert "Runtime > Change runtime type > CPU" in words
    assert "set_logical_device_configuration" in words
    assert not simulated.is_active()
    assert config.list_physical_devices("GPU") == [config.PhysicalDevice("/physical_device:GPU:0", "GPU")]


def test_the_simulation_itself_refuses_when_cuda_is_available(real_gpus) -> None:
    # The layer below config refuses on its own too: nothing reaches torch's patches.
    real_gpus(2)
    with pytest.raises(RuntimeError, match="real CUDA GPUs are available"):
        simulated.start(2)
    assert not simulated.is_active()


def test_the_environment_switch_is_ignored_with_a_warning(real_gpus, monkeypatch) -> None:
    real_gpus(1)
    monkeypatch.setenv("DEVLAB_SIMULATE_GPUS", "2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert config.simulate_from_environment() is False
    (warning,) = caught
    assert "ignored DEVLAB_SIMULATE_GPUS='2'" in str(warning.message)
    assert "1 real GPU" in str(warning.message)
    assert not simulated.is_active()


def test_a_lesson_that_needs_two_says_what_will_not_run_on_one(real_gpus, capsys) -> None:
    real_gpus(1)
    needs_gpus(2, "exercise 4 (two GPUs at once)")
    said = capsys.readouterr().out
    assert said.startswith("This notebook uses 2 GPUs; this machine has 1 GPU (/GPU:0: Tesla T4).")
    assert "exercise 4 (two GPUs at once) will not run here" in said
    assert "(Run All stops there); the other cells run on the real GPU" in said
    assert "Runtime > Change runtime type > CPU" in said
    assert not simulated.is_active()


@pytest.mark.parametrize("real", [1, 2, 3])
def test_a_lesson_with_enough_real_gpus_says_nothing(real_gpus, capsys, real: int) -> None:
    real_gpus(real)
    needs_gpus(min(real, 2), "anything")
    assert capsys.readouterr().out == ""


def test_a_lesson_without_any_gpu_points_at_the_simulation(capsys) -> None:
    assert config.list_physical_devices("GPU") == []  # this machine, not faked
    needs_gpus(2, "the second half")
    said = capsys.readouterr().out
    assert "has none, so the second half will not run" in said
    assert "devlab.config.simulate_gpus(2)" in said


def test_simulated_gpus_count_as_gpus_for_a_lesson(capsys) -> None:
    config.simulate_gpus(2)
    needs_gpus(2, "anything")
    assert capsys.readouterr().out == ""
    needs_gpus(3, "the third GPU's cells")
    said = capsys.readouterr().out
    assert "2 simulated GPUs are running, so the third GPU's cells will not run" in said
    assert "devlab.config.simulate_gpus(3)" in said


def test_message_counts_several_real_gpus() -> None:
    gpus = [config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(2)]
    words = shortfall_message(4, "part 3", gpus)
    assert words.startswith("This notebook uses 4 GPUs; this machine has 2 GPUs (/GPU:0, /GPU:1).")
