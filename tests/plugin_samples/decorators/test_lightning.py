"""Lightning's GPU gate, `RunIf(min_cuda_gpus=N)` (and `bf16_cuda`), on a Trainer and a Fabric
run: skipped on a CPU-only machine, run on simulated GPUs."""

import torch
from conftest import RunIf
from lightning.fabric import Fabric
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel


class SeesItsDevice(BoringModel):
    """Notes where its weights and batches are while it trains (Lightning moves the model back
    to the CPU when fit ends)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[torch.device, torch.device]] = set()

    def training_step(self, batch, batch_idx):
        self.seen.add((self.layer.weight.device, batch.device))
        return super().training_step(batch, batch_idx)


def fit(model: BoringModel, tmp_path, **trainer_args) -> Trainer:
    trainer = Trainer(max_steps=3, limit_val_batches=0, enable_progress_bar=False,
                      enable_model_summary=False, logger=False, enable_checkpointing=False,
                      default_root_dir=tmp_path, **trainer_args)
    trainer.fit(model)
    return trainer


@RunIf(min_cuda_gpus=1)
def test_trainer_fits_on_gpu(tmp_path):
    model = SeesItsDevice()
    trainer = fit(model, tmp_path, accelerator="gpu", devices=1)
    cuda0 = torch.device("cuda", 0)
    assert trainer.strategy.root_device == cuda0
    assert model.seen == {(cuda0, cuda0)}
    assert trainer.global_step == 3


@RunIf(min_cuda_gpus=2)
def test_trainer_on_the_second_gpu(tmp_path):
    model = SeesItsDevice()
    trainer = fit(model, tmp_path, accelerator="cuda", devices=[1])
    cuda1 = torch.device("cuda", 1)
    assert trainer.strategy.root_device == cuda1
    assert model.seen == {(cuda1, cuda1)}


@RunIf(min_cuda_gpus=1, bf16_cuda=True)
def test_fabric_bf16_mixed():
    fabric = Fabric(accelerator="cuda", devices=1, precision="bf16-mixed")
    layer = torch.nn.Linear(8, 2)
    model, _ = fabric.setup(layer, torch.optim.SGD(layer.parameters(), lr=0.1))
    assert fabric.device == torch.device("cuda", 0)
    with fabric.autocast():
        out = layer(torch.randn(4, 8, device=fabric.device))
    assert out.dtype == torch.bfloat16 and out.is_cuda
    assert model(torch.randn(4, 8, device=fabric.device)).dtype == torch.float32  # Fabric's
