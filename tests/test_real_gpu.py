"""A machine with real GPUs (Colab's GPU runtime has one), faked at the boundary.

No GPU exists where these tests run, so torch.cuda's device queries and the NVML library
(`pynvml`, what devlab.engine.nvml_reader calls) answer as a driver with `n` GPUs would. What is tested is
devlab's own logic on top: simulated GPUs are refused beside real ones with words that say
what to do, the environment switch is ignored with a warning, and a lesson that needs more
GPUs than there are gets them by splitting one, and says plainly what will not run.
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Callable

import pytest
import torch

from devlab.core import config
from devlab.engine import nvml_reader as nvml
from devlab.engine import runtime, simulated
from devlab.fronts.lab import lesson

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


CUDA0 = torch.device("cuda", 0)


def test_one_real_gpu_is_split_into_two_logical_gpus_for_a_lesson(real_gpus, capsys) -> None:
    # Colab's GPU runtime: as the TensorFlow guide simulates several GPUs on one.
    real_gpus(1)
    lab = lesson.setup(gpus=2)
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("devlab.lesson: 1 real GPU (/GPU:0: Tesla T4); GPU:0 split into 2 "
                           f"logical GPUs of {T4_MEMORY // 2**20 // 2} MB each (/GPU:0 and /GPU:1)")
    assert "all are cuda:0, sharing its compute and memory" in line
    assert line.endswith("GPUs: /GPU:0 = cuda:0, /GPU:1 = cuda:0.")  # no "simulated" anywhere
    assert lab.gpus == [CUDA0, CUDA0] and lab.names == ["/GPU:0", "/GPU:1"]
    assert not simulated.is_active()
    assert not runtime.is_initialized(), "the split must be chosen before CUDA starts"
    (gpu,) = config.list_physical_devices("GPU")
    assert [c.memory_limit for c in config.get_logical_device_configuration(gpu)] == \
        [T4_MEMORY // 2**20 // 2] * 2


def test_on_a_real_gpu_cells_that_need_a_model_or_two_devices_are_named(real_gpus, capsys) -> None:
    real_gpus(1)
    lesson.setup(gpus=2, model="T4", cells={"model": "the explain cell",
                                            "separate_gpus": "the Copying section's cells"})
    line, *notes = capsys.readouterr().out.splitlines()
    assert notes == [
        "Times on a real GPU are measured, not modeled on the T4; the explain cell needs a "
        "modeled GPU, so it will not run here (Run All goes on past it). A runtime without a "
        "GPU (in Colab: Runtime > Change runtime type > CPU) runs them on simulated GPUs.",
        "The Copying section's cells need two separate CUDA devices (cuda:0 and cuda:1), and "
        "this machine has one real GPU, so they will not run here (Run All goes on past them). "
        "A runtime without a GPU (in Colab: Runtime > Change runtime type > CPU) runs them on "
        "simulated GPUs.",
    ]
    assert not simulated.is_active()


def test_a_one_gpu_lesson_says_which_cells_need_a_second_device(real_gpus, capsys) -> None:
    real_gpus(1)
    lab = lesson.setup(gpus=1, cells={"separate_gpus": "the data-parallel section's cells"})
    line, note = capsys.readouterr().out.splitlines()
    assert line == "devlab.lesson: 1 real GPU (/GPU:0: Tesla T4). GPUs: /GPU:0 = cuda:0."
    assert note.startswith("The data-parallel section's cells need two separate CUDA devices")
    assert lab.gpus == [CUDA0]


@pytest.mark.parametrize("real", [2, 3])
def test_with_enough_real_gpus_a_lesson_uses_them_and_hides_the_rest(real_gpus, capsys, real) -> None:
    real_gpus(real)
    lab = lesson.setup(gpus=2, cells={"separate_gpus": "anything"})
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"devlab.lesson: {real} real GPUs (/GPU:0: Tesla T4, /GPU:1: Tesla T4")
    assert ("GPU:2 hidden (set_visible_devices): this lesson uses 2" in line) == (real == 3)
    assert lab.gpus == [CUDA0, torch.device("cuda", 1)]


def test_on_kaggles_two_t4s_the_lessons_use_both_and_their_times_are_measured(real_gpus,
                                                                              capsys) -> None:
    """Kaggle's "GPU T4 x2": lesson 06's set-up call, as written, takes both real T4s (each its
    own CUDA device, so the DDP cells run), simulates nothing, and says its cells' times are
    measured, not modeled on the T4 it names."""
    real_gpus(2)
    lab = lesson.setup(gpus=2, model="T4", cells={
        "separate_gpus": "the training cell and the cell that times a DDP step on two GPUs"})
    line, *notes = capsys.readouterr().out.splitlines()
    assert line == ("devlab.lesson: 2 real GPUs (/GPU:0: Tesla T4, /GPU:1: Tesla T4). GPUs: "
                    "/GPU:0 = cuda:0, /GPU:1 = cuda:1."), line
    assert notes == ["Times on a real GPU are measured, not modeled on the T4."]
    assert lab.gpus == [CUDA0, torch.device("cuda", 1)] and not simulated.is_active()
    assert lab.times == "measured with CUDA events on the real GPUs"


def test_on_kaggles_two_t4s_lesson_04_keeps_the_second_for_its_ddp_cells(real_gpus,
                                                                        capsys) -> None:
    """Lesson 04 follows the TensorFlow guide on one GPU, and its DDP cells need one CUDA device
    per rank: on Kaggle's two T4s it keeps the second visible for them (a third would be hidden),
    says so, and the guide's split of the first GPU then gives three logical GPUs, as
    TensorFlow's gives on a two-GPU machine."""
    real_gpus(3)
    lab = lesson.setup(gpus=1, model="T4", cells={"separate_gpus": "the DDP cells"})
    line, *notes = capsys.readouterr().out.splitlines()
    assert "GPU:1 kept visible for the DDP cells (one CUDA device per rank)" in line, line
    assert "GPU:2 hidden (set_visible_devices): this lesson uses 2" in line, line
    assert notes == ["Times on a real GPU are measured, not modeled on the T4."], notes
    assert lab.gpus == [CUDA0, torch.device("cuda", 1)]
    first = config.list_physical_devices("GPU")[0]
    config.set_logical_device_configuration(
        first, [config.LogicalDeviceConfiguration(memory_limit=1024)] * 2)  # the guide's cell
    assert lab.names == ["/GPU:0", "/GPU:1", "/GPU:2"]
    assert lab.gpus == [CUDA0, CUDA0, torch.device("cuda", 1)]


def test_a_one_gpu_lesson_without_ddp_cells_hides_the_second_real_gpu(real_gpus, capsys) -> None:
    real_gpus(2)
    lab = lesson.setup(gpus=1)
    (line,) = capsys.readouterr().out.splitlines()
    assert "GPU:1 hidden (set_visible_devices): this lesson uses 1" in line, line
    assert lab.gpus == [CUDA0]


def test_once_cuda_has_started_a_gpu_cannot_be_split_and_the_lesson_says_so(real_gpus, capsys,
                                                                            monkeypatch) -> None:
    real_gpus(1)
    monkeypatch.setattr(runtime, "_real_cuda_is_initialized", lambda: True)
    lab = lesson.setup(gpus=2, cells={"gpus": "exercise 4"})
    line, note = capsys.readouterr().out.splitlines()
    assert "This lesson uses 2 GPUs and this kernel has 1, in use already, so exercise 4 will " \
           "not run." in note and "Restart session" in note
    assert lab.gpus == [CUDA0] and config.get_logical_device_configuration(
        config.list_physical_devices("GPU")[0]) is None
