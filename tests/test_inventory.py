"""The device table `%devices` shows: physical and logical GPUs counted as TensorFlow counts them."""

from __future__ import annotations

import devlab
from devlab.core import config
from devlab.core.config import LogicalDeviceConfiguration


def test_one_gpu_split_in_two_is_one_physical_gpu_and_two_logical_ones() -> None:
    config.simulate_gpus(1)
    (gpu,) = config.list_physical_devices("GPU")
    config.set_logical_device_configuration(gpu, [LogicalDeviceConfiguration(1024)] * 2)
    table = devlab.device_table()
    rows = [r for r in table.rows if r.device_type == "GPU"]
    assert [r.torch_device for r in rows] == ["cuda:0", "cuda:1"]
    assert table.status.endswith("1 Physical GPU, 2 Logical GPUs: /physical_device:GPU:0 is "
                                 "split into /device:GPU:0 and /device:GPU:1.")
    # The same words as the count TensorFlow's guide prints for the same split.
    logical = config.list_logical_devices("GPU")
    assert f"{len(config.list_physical_devices('GPU'))} Physical GPU, {len(logical)} Logical " \
           "GPUs" in table.text()
    assert table.status in table._repr_html_()


def test_a_hidden_gpu_is_counted_as_physical_but_not_logical() -> None:
    config.simulate_gpus(2)
    cpu, gpu0, gpu1 = config.list_physical_devices()
    config.set_visible_devices([cpu, gpu1])
    status = devlab.device_table().status
    assert status.endswith("2 Physical GPUs, 1 Logical GPU: /physical_device:GPU:0 is hidden "
                           "(devlab.config.set_visible_devices).")


def test_one_logical_gpu_per_physical_one_needs_no_such_sentence() -> None:
    assert devlab.core.inventory.physical_and_logical() is None  # no GPU at all
    config.simulate_gpus(2)
    assert devlab.core.inventory.physical_and_logical() is None
    assert devlab.device_table().status == config.gpu_status()
