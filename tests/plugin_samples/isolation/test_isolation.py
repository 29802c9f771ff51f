"""Each test starts afresh; the marker asks for GPUs; a leak is reported."""

import pytest
import torch

KEPT = []


def test_a_leaves_state_behind():
    torch.cuda.set_device(1)
    side = torch.cuda.Stream()
    torch.cuda.set_stream(side)
    x = torch.ones(1024, 1024, device="cuda")  # 4 MiB, freed at return
    assert torch.cuda.max_memory_allocated() >= x.nbytes


def test_b_starts_afresh():
    assert torch.cuda.current_device() == 0
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert torch.cuda.max_memory_allocated(1) == 0
    assert torch.cuda.memory_reserved(1) == 0


def test_leaks_a_tensor():
    KEPT.append(torch.ones(256, 1024, device="cuda"))  # 1 MiB kept in a global


@pytest.mark.simulated_gpus(4)
def test_needs_four():
    assert torch.cuda.device_count() >= 4


@pytest.mark.simulated_gpus(n=1, model="T4", memory="64MiB")
def test_own_model_and_memory(simulated_gpus):
    assert simulated_gpus.model == "T4"
    assert "T4" in torch.cuda.get_device_name(0)
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"):
        torch.empty(128, 1024, 1024, dtype=torch.uint8, device="cuda")


def test_back_to_the_session_gpus(simulated_gpus):
    assert simulated_gpus.model is None
    assert torch.cuda.device_count() == 2
    assert "T4" not in torch.cuda.get_device_name(0)


def test_a_finding_taken_on_purpose(simulated_gpus):
    host = torch.ones(4, device="cuda").to("cpu", non_blocking=True)
    host.sum()
    (finding,) = simulated_gpus.take_findings()
    assert finding.kind == "read-before-sync"
