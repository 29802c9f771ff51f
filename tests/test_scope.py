from __future__ import annotations

import pytest
import torch
from torch import nn

import devlab
from devlab.core import config, placement_log
from devlab.core.config import LogicalDeviceConfiguration, PhysicalDevice
from devlab.engine import runtime


def test_tensors_and_modules_created_inside_land_on_the_device() -> None:
    with devlab.device("/CPU:0") as placement:
        x = torch.ones(2)
        layer = nn.Linear(2, 2)
        assert torch.get_default_device() == torch.device("cpu")
    assert placement.full_name == "/job:localhost/replica:0/task:0/device:CPU:0"
    assert x.device == torch.device("cpu") and layer.weight.device == torch.device("cpu")
    assert runtime.is_initialized()


def test_unknown_device_is_an_error_naming_it_and_the_available_ones() -> None:
    with pytest.raises(RuntimeError) as err:
        with devlab.device("/GPU:2"):
            pass
    message = str(err.value)
    assert message.startswith("/job:localhost/replica:0/task:0/device:GPU:2 unknown device.")
    assert "All available devices: [/job:localhost/replica:0/task:0/device:CPU:0]" in message


def test_an_unknown_gpu_on_a_machine_without_one_suggests_soft_placement_and_simulated_gpus():
    with pytest.raises(RuntimeError) as err:
        devlab.resolve("/GPU:1")
    message = str(err.value)
    assert "devlab.config.set_soft_device_placement(True), or %%device --soft" in message
    assert message.endswith("Or simulate GPUs on the CPU: devlab.config.simulate_gpus(2), before "
                            "placing any work.")
    # What it suggests works: two simulated GPUs give /GPU:1.
    config.simulate_gpus(2)
    assert devlab.resolve("/GPU:1").device == torch.device("cuda", 1)


def test_once_work_was_placed_the_suggestion_is_to_restart_first() -> None:
    config.simulate_gpus(2)
    torch.ones(1, device="cuda:0")  # the runtime starts: the devices are fixed now
    with pytest.raises(RuntimeError) as err:
        devlab.resolve("/GPU:3")
    assert str(err.value).endswith(
        "Or simulate GPUs on the CPU: restart the kernel, then call "
        "devlab.config.simulate_gpus(4) before placing any work (devices cannot change once "
        "work has been placed).")
    with pytest.raises(RuntimeError, match="cannot be modified after being initialized"):
        config.simulate_gpus(4)  # why the restart: simulating now is refused


def test_no_simulation_is_suggested_beside_real_gpus(monkeypatch) -> None:
    monkeypatch.setattr(config, "list_physical_devices", lambda kind=None: [
        PhysicalDevice("/physical_device:GPU:0", "GPU")])
    from devlab.core import placement_scope as scope

    assert scope._simulate_hint(devlab.DeviceSpec.from_string("/GPU:1")) == ""
    assert scope._simulate_hint(devlab.DeviceSpec.from_string("/CPU:1")) == ""


def test_soft_placement_falls_back_and_says_so_in_the_log() -> None:
    with placement_log.capture() as log:
        with devlab.device("/GPU:2", soft=True) as placement:
            torch.ones(1)
    assert placement.fell_back and placement.device == torch.device("cpu")
    lines = log.lines()
    assert lines[0] == (
        "Soft placement: /job:localhost/replica:0/task:0/device:GPU:2 does not exist; "
        "placed on /job:localhost/replica:0/task:0/device:CPU:0 instead."
    )
    config.set_soft_device_placement(True)
    assert devlab.resolve("/GPU:5").fell_back


def test_a_name_without_index_means_index_zero_and_logical_cpus_resolve() -> None:
    cpu = PhysicalDevice("/physical_device:CPU:0", "CPU")
    config.set_logical_device_configuration(cpu, [LogicalDeviceConfiguration()] * 2)
    assert devlab.resolve("/CPU").full_name.endswith("device:CPU:0")
    assert devlab.resolve("/cpu:1").full_name.endswith("device:CPU:1")
    assert devlab.resolve("/cpu:1").device == torch.device("cpu")


def test_bad_names_are_value_errors() -> None:
    with pytest.raises(ValueError, match="Unknown attribute 'foo'"):
        devlab.resolve("/foo:1")
    with pytest.raises(ValueError, match="names no device type"):
        devlab.resolve("/job:localhost")


@pytest.mark.parametrize("exc", [ZeroDivisionError, KeyboardInterrupt])
def test_default_device_is_restored_after_errors(exc: type[BaseException]) -> None:
    before = (torch.get_default_device(), torch._C._len_torch_function_stack())
    with pytest.raises(exc):
        with devlab.device("/CPU:0"):
            raise exc()
    assert (torch.get_default_device(), torch._C._len_torch_function_stack()) == before


def test_decorator_form_and_nesting() -> None:
    @devlab.device("/CPU:0")
    def make() -> torch.Tensor:
        assert torch._C._len_torch_function_stack() == 1
        return torch.zeros(1)

    assert make().device == torch.device("cpu")
    assert make().device == torch.device("cpu")  # reusable
    with devlab.device("/CPU:0"):
        with devlab.device("cpu"):
            pass
        assert torch._C._len_torch_function_stack() == 1
    assert torch._C._len_torch_function_stack() == 0


def test_loading_devlab_moves_nothing() -> None:
    assert torch.ones(1).device == torch.device("cpu")
    assert torch.get_default_device() == torch.device("cpu")


def test_session_default_and_reset() -> None:
    devlab.core.placement_scope.set_default("/CPU:0")
    assert torch.get_default_device() == torch.device("cpu")
    devlab.core.placement_scope.reset_default()
    assert torch._C._len_torch_function_stack() == 0


def test_resolve_device_gives_the_torch_device_a_name_runs_on() -> None:
    assert devlab.core.placement_scope.resolve_device("/CPU:0") == torch.device("cpu")
    assert devlab.core.placement_scope.resolve_device("/device:cpu:0") == torch.device("cpu")
    # A torch.device is taken as it is, existing or not: the caller chose it.
    assert devlab.core.placement_scope.resolve_device(torch.device("cuda", 3)) == torch.device("cuda", 3)
    with pytest.raises(RuntimeError, match="unknown device"):
        devlab.core.placement_scope.resolve_device("/GPU:0")


def test_device_label_names_simulated_gpus_as_such() -> None:
    assert devlab.core.placement_scope.device_label(torch.device("cpu")) == "CPU:0"
    assert devlab.core.placement_scope.device_label(torch.device("cuda", 1)) == "GPU:1"
    config.simulate_gpus(1)
    assert devlab.core.placement_scope.device_label(torch.device("cuda")) == "GPU:0 (simulated)"


@pytest.mark.parametrize("index", ["128", "1" * 4000])
def test_an_index_no_torch_device_has_is_an_unknown_device_quoted_in_part(index: str) -> None:
    with pytest.raises(RuntimeError, match="unknown device") as err:
        devlab.resolve(f"/GPU:{index}")
    assert len(str(err.value)) < 500
    # With soft placement it falls back like any device that does not exist.
    placement = devlab.resolve(f"/GPU:{index}", soft=True)
    assert placement.fell_back and placement.device == torch.device("cpu")
    assert len(placement.note) < 300
