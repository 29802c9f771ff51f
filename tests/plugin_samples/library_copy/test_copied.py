"""The same tests, in the style of Lightning's own (a CPU variant, and a CUDA one gated by
`RunIf(min_cuda_gpus=N)`'s reasons), on the installed Lightning and on the copy with bugs seeded
(NOTICE.md): CPU-only CI passes both; on simulated GPUs the copy's CUDA variants fail."""

import socket

import pytest
import ranks
import torch
import torch.multiprocessing as mp
from copied_lightning import apply_func as copied_apply_func
from copied_lightning import device_dtype_mixin as copied_mixin
from copied_lightning import memory as copied_memory
from copied_lightning import transformer as copied_transformer
from lightning.fabric.utilities import apply_func as lightning_apply_func
from lightning.fabric.utilities import device_dtype_mixin as lightning_mixin
from lightning.fabric.utilities.testing import _runif_reasons
from lightning.pytorch.demos import transformer as lightning_transformer
from lightning.pytorch.utilities import memory as lightning_memory


def _devices(min_cuda_gpus: int) -> list:
    reasons, _ = _runif_reasons(min_cuda_gpus=min_cuda_gpus)
    return ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
        bool(reasons), reason=f"Requires: [{' + '.join(reasons)}]"))]


DEVICES = _devices(1)
TWO_GPUS = _devices(2)
APPLY = {"lightning": lightning_apply_func, "copy": copied_apply_func}
TRANSFORMER = {"lightning": lightning_transformer, "copy": copied_transformer}
MIXIN = {"lightning": lightning_mixin, "copy": copied_mixin}
MEMORY = {"lightning": lightning_memory, "copy": copied_memory}


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


@pytest.mark.parametrize("source", ["lightning", "copy"])
@pytest.mark.parametrize("device", TWO_GPUS)
def test_module_cuda_with_an_index(source, device):
    class Net(MIXIN[source]._DeviceDtypeModuleMixin):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.layer(x)

    net = Net()
    net = net.cuda(1) if device == "cuda" else net.cpu()
    x = torch.randn(3, 4, device="cuda:1" if device == "cuda" else "cpu")
    assert net(x).device == x.device == net.device


@pytest.mark.parametrize("source", ["lightning", "copy"])
@pytest.mark.parametrize("device", DEVICES)
def test_batch_size_backs_off_on_oom(source, device):
    memory = MEMORY[source]

    def step(batch_size):
        if device == "cpu":  # CPU CI's stand-in for the GPU running out of memory
            if batch_size > 64:
                raise RuntimeError("CUDA error: out of memory")
            return
        activations = torch.empty(batch_size, 1024, 1024, device=device)  # 4 MiB a sample
        del activations

    batch_size = 1024
    while True:  # halve until a step fits, as Lightning's batch size finder does
        try:
            step(batch_size)
            break
        except RuntimeError as exception:
            if not memory.is_oom_error(exception) or batch_size == 1:
                raise
            memory.garbage_collection_cuda()
            batch_size //= 2
    assert 1 <= batch_size <= 64


@pytest.mark.parametrize("source", ["lightning", "copy"])
@pytest.mark.parametrize("device", TWO_GPUS)
def test_gather_all_tensors_of_uneven_sizes(source, device):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    mp.spawn(ranks.gather_rank, args=(2, port, source, device), nprocs=2, join=True)
