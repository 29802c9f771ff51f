"""The same tests, in the style of Lightning's own (a CPU variant, and a CUDA one gated by
`RunIf(min_cuda_gpus=1)`), on the installed Lightning and on the copy with bugs seeded
(NOTICE.md): CPU-only CI passes both; on simulated GPUs the copy's CUDA variants fail."""

import pytest
import torch
from copied_lightning import apply_func as copied_apply_func
from copied_lightning import transformer as copied_transformer
from lightning.fabric.utilities import apply_func as lightning_apply_func
from lightning.fabric.utilities.testing import _runif_reasons
from lightning.pytorch.demos import transformer as lightning_transformer

_reasons, _ = _runif_reasons(min_cuda_gpus=1)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    bool(_reasons), reason=f"Requires: [{' + '.join(_reasons)}]"))]
APPLY = {"lightning": lightning_apply_func, "copy": copied_apply_func}
TRANSFORMER = {"lightning": lightning_transformer, "copy": copied_transformer}


@pytest.mark.parametrize("source", ["lightning", "copy"])
@pytest.mark.parametrize("device", DEVICES)
def test_move_data_to_device_and_back(source, device):
    move = APPLY[source].move_data_to_device
    batch = {"x": torch.arange(4.0), "y": [torch.ones(2, 3), "label"]}
    on_device = move(batch, device)
    assert on_device["x"].device.type == device
    on_device["x"] = on_device["x"] * 2  # the device's work, then the results back to the host
    back = move(on_device, torch.device("cpu"))
    assert back["x"].tolist() == [0.0, 2.0, 4.0, 6.0]
    assert back["y"][0].sum().item() == 6.0 and back["y"][1] == "label"


@pytest.mark.parametrize("source", ["lightning", "copy"])
@pytest.mark.parametrize("device", DEVICES)
def test_positional_encoding_on_the_modules_device(source, device):
    torch.manual_seed(0)
    encoding = TRANSFORMER[source].PositionalEncoding(dim=8, dropout=0.0, max_len=16).to(device)
    x = torch.randn(2, 5, 8, device=device)
    out = encoding(x)
    assert out.device == x.device and out.shape == x.shape
    assert not torch.equal(out, x)
