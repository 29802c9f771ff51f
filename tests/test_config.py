from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import devlab
from devlab.core import config
from devlab.core.config import LogicalDeviceConfiguration, PhysicalDevice
from devlab.engine import runtime

CPU = PhysicalDevice("/physical_device:CPU:0", "CPU")


def test_import_and_list_physical_devices_without_a_gpu() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import devlab; print(devlab.config.list_physical_devices())"],
        capture_output=True, text=True, check=True,
    )
    assert out.stdout.strip() == "[PhysicalDevice(name='/physical_device:CPU:0', device_type='CPU')]"
    assert out.stderr == ""


def test_physical_and_logical_devices_look_like_tensorflows() -> None:
    assert config.list_physical_devices() == [CPU]
    assert config.list_physical_devices("GPU") == []
    assert config.list_physical_devices("gpu") == []
    logical = config.list_logical_devices()
    assert [(d.name, d.device_type) for d in logical] == [("/device:CPU:0", "CPU")]
    assert logical[0].torch_device == torch.device("cpu")
    assert repr(logical[0]) == "LogicalDevice(name='/device:CPU:0', device_type='CPU')"


def test_gpu_status_says_why_there_is_no_gpu() -> None:
    status = config.gpu_status()
    assert status.startswith("No GPU:")
    assert "simulate_gpus" in status


def test_device_details_work_without_a_gpu_or_driver() -> None:
    details = config.get_device_details(CPU)
    assert details["total_memory"] > 0 and details["cores"] >= 1
    with pytest.raises(ValueError, match="Unrecognized device"):
        config.get_device_details(PhysicalDevice("/physical_device:GPU:0", "GPU"))


def test_listing_logical_devices_initializes_the_runtime_and_fixes_settings() -> None:
    config.set_logical_device_configuration(CPU, [LogicalDeviceConfiguration(), LogicalDeviceConfiguration()])
    assert not runtime.is_initialized()
    names = [d.name for d in config.list_logical_devices("CPU")]
    assert names == ["/device:CPU:0", "/device:CPU:1"]
    assert runtime.is_initialized()
    with pytest.raises(RuntimeError, match="^Virtual devices cannot be modified after being initialized$"):
        config.set_logical_device_configuration(CPU, [LogicalDeviceConfiguration()])
    # Setting the same value again is a no-op, as in TensorFlow.
    config.set_logical_device_configuration(CPU, [LogicalDeviceConfiguration(), LogicalDeviceConfiguration()])
    assert config.get_logical_device_configuration(CPU) == [LogicalDeviceConfiguration()] * 2


def test_visible_devices_rules() -> None:
    assert config.get_visible_devices() == [CPU]
    config.set_visible_devices([CPU])  # same value: allowed, even twice
    with pytest.raises(ValueError, match="The CPU must stay visible"):
        config.set_visible_devices([], "CPU")
    with pytest.raises(ValueError, match="Unrecognized device"):
        config.set_visible_devices([PhysicalDevice("/physical_device:GPU:3", "GPU")])
    with pytest.raises(ValueError, match="is not a GPU device"):
        config.set_visible_devices([CPU], "GPU")


def test_memory_growth_and_limits_only_where_tensorflow_allows_them() -> None:
    with pytest.raises(ValueError, match="^Cannot set memory growth on non-GPU and non-Pluggable devices$"):
        config.set_memory_growth(CPU, True)
    with pytest.raises(ValueError, match="^Setting memory limit on CPU virtual devices is currently not supported$"):
        config.set_logical_device_configuration(CPU, [LogicalDeviceConfiguration(memory_limit=10)])
    with pytest.raises(ValueError, match="memory_limit is a whole number of megabytes"):
        LogicalDeviceConfiguration(memory_limit=-1)
    with pytest.raises(TypeError, match="Expected devlab.config.LogicalDeviceConfiguration"):
        config.set_logical_device_configuration(CPU, [{"memory_limit": 1}])  # type: ignore[list-item]


def test_soft_placement_is_off_by_default_and_switchable() -> None:
    assert config.get_soft_device_placement() is False
    config.set_soft_device_placement(True)
    assert config.get_soft_device_placement() is True
    with pytest.raises(TypeError, match="True or False"):
        config.set_soft_device_placement("yes")  # type: ignore[arg-type]


def test_simulate_gpus_rejects_bad_counts() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="number of GPUs to simulate"):
            config.simulate_gpus(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="megabytes greater than 0"):
        config.simulate_gpus(1, memory_limit=0)


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "64"])
def test_memory_limits_are_whole_megabytes_above_zero_wherever_they_are_given(bad: object) -> None:
    with pytest.raises(ValueError) as err:
        LogicalDeviceConfiguration(memory_limit=bad)  # type: ignore[arg-type]
    assert str(err.value) == f"memory_limit is a whole number of megabytes greater than 0, got {bad!r}."
    with pytest.raises(ValueError, match="megabytes greater than 0"):
        config.simulate_gpus(1, memory_limit=bad)  # type: ignore[arg-type]
    assert not devlab.simulated.is_active()


def test_issue_16_memory_limit_2_to_the_70_and_10000_logical_devices_are_refused() -> None:
    # As the issue wrote it: `memory_limit=2**70` and 10,000 logical devices were accepted.
    with pytest.raises(ValueError, match=r"memory_limit is at most 8,796,093,022,207 MB \(8 EiB"):
        LogicalDeviceConfiguration(memory_limit=2**70)
    with pytest.raises(ValueError, match="at most 8,796,093,022,207 MB"):
        config.simulate_gpus(1, memory_limit=2**70)
    assert not devlab.simulated.is_active()
    assert LogicalDeviceConfiguration(memory_limit=(2**63 - 1) // 2**20).memory_limit
    config.simulate_gpus(1)
    (gpu,) = config.list_physical_devices("GPU")
    with pytest.raises(ValueError, match="torch numbers devices 0 to 127, so there can be at most 128"):
        config.set_logical_device_configuration(gpu, [LogicalDeviceConfiguration(memory_limit=1)] * 10_000)
    with pytest.raises(ValueError, match="at most 128"):
        config.set_logical_device_configuration(CPU, [LogicalDeviceConfiguration()] * 10_000)
    # Nothing was half-configured: one GPU, one CPU, as before.
    assert config.get_logical_device_configuration(gpu) is None
    assert [d.name for d in config.logical_devices()] == ["/device:CPU:0", "/device:GPU:0"]
    config.set_logical_device_configuration(gpu, [LogicalDeviceConfiguration(memory_limit=1)] * 128)
    assert config.logical_devices("GPU")[-1].torch_device == torch.device("cuda", 127)


def test_logical_configuration_fields_are_checked_where_given() -> None:
    with pytest.raises(TypeError, match="experimental_priority is a whole number or None"):
        LogicalDeviceConfiguration(memory_limit=64, experimental_priority="high")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a number of 16,610 bits"):
        LogicalDeviceConfiguration(memory_limit=10**5000)


def test_d2l_helpers_without_a_gpu_are_drop_in() -> None:
    assert devlab.cpu() == torch.device("cpu")
    assert devlab.gpu() == torch.device("cuda", 0)
    assert devlab.gpu(1) == torch.device("cuda", 1)
    assert devlab.num_gpus() == 0
    assert devlab.try_gpu() == torch.device("cpu")
    assert devlab.try_gpu(10) == torch.device("cpu")
    assert devlab.try_all_gpus() == [torch.device("cpu")]
    assert not runtime.is_initialized(), "the d2l helpers must not fix device settings"


def test_memory_growth_off_on_a_simulated_gpu_reserves_its_free_memory_at_first_use() -> None:
    # As devlab does on a real GPU (and TensorFlow by default): at its first use, a GPU without
    # memory growth reserves nine tenths of its free memory as one cached segment of CUDA's
    # caching allocator, rounded up to 2 MiB; tensors are then split from it.
    from devlab.engine import simulated

    mib = 1024 * 1024
    config.simulate_gpus(2, memory_limit=64)
    gpu0, gpu1 = config.list_physical_devices("GPU")
    config.set_memory_growth(gpu0, False)
    config.set_memory_growth(gpu0, True)  # before first use: grows on demand again
    config.set_memory_growth(gpu0, False)
    # Each logical device of a GPU without memory growth reserves from its own limit.
    config.set_logical_device_configuration(
        gpu1, [LogicalDeviceConfiguration(16), LogicalDeviceConfiguration(32)])
    config.set_memory_growth(gpu1, False)
    assert [simulated.memory_stats(i)["reserved"] for i in range(3)] == [0, 0, 0]
    x = torch.ones(mib, device="cuda:0")  # 4 MiB, split from 0.9 x 64 MiB -> 58 MiB
    assert simulated.memory_stats(0) == {"allocated": 4 * mib, "peak": 4 * mib, "limit": 64 * mib,
                                         "reserved": 58 * mib}
    y = torch.ones(1, device="cuda:2")  # 0.9 x 32 MiB -> 30 MiB, and a 2 MiB small segment
    assert [simulated.memory_stats(i)["reserved"] for i in range(3)] == [58 * mib, 0, 32 * mib]
    assert torch.cuda.memory_reserved(0) == 58 * mib and torch.cuda.memory_reserved(1) == 0
    with pytest.raises(RuntimeError, match="^Physical devices cannot be modified after being initialized$"):
        config.set_memory_growth(gpu0, True)
    del x, y


def test_memory_growth_off_on_a_simulated_gpu_without_a_limit_reserves_what_it_allocates() -> None:
    from devlab.engine import simulated

    config.simulate_gpus(1)
    (gpu,) = config.list_physical_devices("GPU")
    config.set_memory_growth(gpu, False)
    assert simulated.memory_stats(0)["reserved"] == 0
    x = torch.ones(1, device="cuda:0")  # the host's memory: nothing to map up front
    assert simulated.memory_stats(0)["reserved"] == torch.cuda.memory_reserved(0) == 2 * 2**20
    del x


def test_visible_devices_renumber_simulated_gpus_like_cuda_visible_devices() -> None:
    config.simulate_gpus(2, memory_limit=64)
    gpus = config.list_physical_devices("GPU")
    config.set_visible_devices(gpus[1], "GPU")
    assert config.get_visible_devices("GPU") == [gpus[1]]
    assert devlab.num_gpus() == 1 and devlab.try_gpu(1) == torch.device("cpu")
    assert torch.cuda.device_count() == 1
    (only,) = config.list_logical_devices("GPU")
    assert (only.name, only.torch_device, only.physical) == ("/device:GPU:0", torch.device("cuda", 0), gpus[1])
    with pytest.raises(RuntimeError, match="^Visible devices cannot be modified after being initialized$"):
        config.set_visible_devices(gpus, "GPU")
    config.set_visible_devices([gpus[1]], "GPU")  # the same choice again: a no-op


def test_memory_growth_on_simulated_gpus_follows_tensorflows_rules() -> None:
    config.simulate_gpus(1, memory_limit=64)
    (gpu,) = config.list_physical_devices("GPU")
    assert config.get_memory_growth(gpu) is True  # PyTorch's caching allocator grows on demand
    config.set_memory_growth(gpu, False)
    assert config.get_memory_growth(gpu) is False
    details = config.get_device_details(gpu)
    assert details == {"device_name": "Simulated GPU (CPU-backed)", "simulated": True, "total_memory": 64 * 2**20}
    torch.ones(1, device="cuda:0")  # first use: the runtime starts
    with pytest.raises(RuntimeError, match="^Physical devices cannot be modified after being initialized$"):
        config.set_memory_growth(gpu, True)
    with pytest.raises(RuntimeError, match="^Physical devices cannot be modified after being initialized"):
        config.simulate_gpus(3)


def test_device_table_shows_simulated_gpus_and_what_they_reserve() -> None:
    config.simulate_gpus(2, memory_limit=64)
    gpus = config.list_physical_devices("GPU")
    config.set_memory_growth(gpus[1], False)
    x = torch.ones(1024, 1024, device="cuda:1")  # 4 MiB
    table = devlab.device_table().text()
    lines = table.splitlines()
    gpu0 = next(line for line in lines if "device:GPU:0" in line)
    gpu1 = next(line for line in lines if "device:GPU:1" in line)
    assert "0 B / 64.0 MiB" in gpu0 and gpu0.rstrip().endswith("simulated")
    assert "4.0 MiB (58.0 MiB reserved) / 64.0 MiB" in gpu1  # 0.9 x 64 MiB, in 2 MiB
    assert lines[-1].startswith("2 simulated GPUs (CPU-backed")
    assert "device:CPU:0" in table and "real" in table
    del x


def test_simulating_again_before_first_use_forgets_the_old_gpus_settings() -> None:
    config.simulate_gpus(2)
    old = config.list_physical_devices("GPU")
    config.set_memory_growth(old[0], False)
    config.set_logical_device_configuration(old[1], [LogicalDeviceConfiguration(memory_limit=8)] * 2)
    config.simulate_gpus(3)
    new = config.list_physical_devices("GPU")
    assert len(new) == 3 and len(config.logical_devices("GPU")) == 3
    assert config.get_memory_growth(new[0]) is True
    assert config.get_logical_device_configuration(new[1]) is None
