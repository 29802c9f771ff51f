"""cuFFT's plan cache on simulated GPUs (issue 29, the notes' "cuFFT plan cache"), the custom
allocator entry points, and PYTORCH_CUDA_ALLOC_CONF's forms the notes give."""

from __future__ import annotations

import pytest
import torch

from devlab.engine import simulated
from devlab.engine.gpu_model import cufft_plan_keys as model
from devlab.engine.gpu_model.caching_allocator import AllocatorConfig, round_size


@pytest.fixture(autouse=True)
def _stop():
    yield
    simulated.stop()


def test_the_cache_answers_for_each_gpu_with_cudas_default_capacity() -> None:
    simulated.start(2, model="T4")
    cache = torch.backends.cuda.cufft_plan_cache
    assert (cache.max_size, cache.size) == (4096, 0)
    x = torch.randn(8, 64, device="cuda")
    torch.fft.rfft(x)
    assert cache.size == 1 and cache[1].size == 0
    torch.fft.rfft(torch.randn(8, 64, device="cuda"))  # same geometry: the same plan
    assert cache.size == 1
    torch.fft.rfft(torch.randn(4, 64, device="cuda"))  # another batch: another plan
    torch.fft.rfft(torch.randn(8, 64, device="cuda:1"))
    assert (cache.size, cache[1].size, cache[torch.device("cuda:1")].size) == (2, 1, 1)


def test_forward_and_inverse_share_a_plan_and_real_input_makes_its_own() -> None:
    simulated.start(1)
    cache = torch.backends.cuda.cufft_plan_cache
    z = torch.randn(8, 64, dtype=torch.complex64, device="cuda")
    torch.fft.fft(z)
    torch.fft.ifft(z)  # C2C either way: one plan
    assert cache.size == 1
    torch.fft.fft(z.to(torch.complex128))  # another value type
    assert cache.size == 2


def test_max_size_evicts_the_least_recently_used_and_is_checked_in_torchs_words() -> None:
    simulated.start(2)
    cache = torch.backends.cuda.cufft_plan_cache
    for n in (16, 32, 64):
        torch.fft.fft(torch.randn(n, dtype=torch.complex64, device="cuda"))
    cache.max_size = 2
    assert (cache.max_size, cache.size) == (2, 2)
    cache[1].max_size = 10
    assert cache[1].max_size == 10 and cache.max_size == 2
    with pytest.raises(RuntimeError, match="^cuFFT plan cache size must be non-negative, "
                                           "but got -1$"):
        cache.max_size = -1
    assert cache.max_size == 2
    cache.max_size = 0  # torch then plans without caching
    torch.fft.fft(torch.randn(8, dtype=torch.complex64, device="cuda"))
    assert cache.size == 0
    cache.max_size = 4
    torch.fft.fft(torch.randn(8, dtype=torch.complex64, device="cuda"))
    assert cache.size == 1
    cache.clear()
    assert cache.size == 0
    with pytest.raises(RuntimeError, match="expected 0 <= device index < 2"):
        cache[2]


def test_lru_order_is_cudas() -> None:
    c = model.PlanCache(2)
    keys = [model.c2c_plans(model.Tensor((n,), (1,), True), [0], "float32")[0]
            for n in (4, 8, 16)]
    c.lookup(keys[0])
    c.lookup(keys[1])
    assert c.lookup(keys[0]) is True  # a hit moves it to the front
    c.lookup(keys[2])  # evicts keys[1], the least recently used
    assert c.keys() == [keys[0], keys[2]]


def test_plan_keys_follow_exec_fft() -> None:
    # a (3, 8) complex signal along dim 1: batch 3, contiguous in and out
    (key,) = model.c2c_plans(model.Tensor((3, 8), (8, 1), True), [1], "float32")
    assert key == model.PlanKey((3, 8), (8, 1), (8, 1), "C2C", "float32")
    # along dim 0 of the same tensor: the batch dim has stride 1, the signal stride 8
    (key,) = model.c2c_plans(model.Tensor((3, 8), (8, 1), True), [0], "float32")
    assert key == model.PlanKey((8, 3), (1, 8), (3, 1), "C2C", "float32")
    # onesided R2C writes n // 2 + 1 outputs; C2R reads them
    (key,) = model.r2c_plans(model.Tensor((2, 10), (10, 1), False), [1], True, "float64")
    assert key == model.PlanKey((2, 10), (10, 1), (6, 1), "R2C", "float64")
    (key,) = model.c2r_plans(model.Tensor((2, 6), (6, 1), True), [1], 10, "float64")
    assert key == model.PlanKey((2, 10), (6, 1), (10, 1), "C2R", "float64")
    # more than 3 dims: cuFFT plans at most 3 at once
    assert len(model.c2c_plans(model.Tensor((2,) * 5, (16, 8, 4, 2, 1), True),
                               range(5), "float32")) == 2


def test_stop_restores_torchs_functions_and_forgets_the_plans() -> None:
    before = (torch._cufft_get_plan_cache_size,
              vars(torch.backends.cuda.cuFFTPlanCache)["max_size"].setter)
    simulated.start(1)
    torch.fft.fft(torch.randn(8, dtype=torch.complex64, device="cuda"))
    assert torch.backends.cuda.cufft_plan_cache.size == 1
    simulated.stop()
    assert (torch._cufft_get_plan_cache_size,
            vars(torch.backends.cuda.cuFFTPlanCache)["max_size"].setter) == before
    simulated.start(1)
    assert torch.backends.cuda.cufft_plan_cache.size == 0


def test_fft_values_are_the_cpus() -> None:
    x = torch.randn(4, 16)
    simulated.start(1)
    y = torch.fft.rfft(x.cuda())
    assert y.device == torch.device("cuda:0")
    torch.testing.assert_close(y.cpu(), torch.fft.rfft(x))


def test_pluggable_allocator_is_devlabs_error_and_a_late_swap_torchs() -> None:
    simulated.start(1)
    with pytest.raises(NotImplementedError, match="CUDAPluggableAllocator .* is not simulated"):
        torch.cuda.memory.CUDAPluggableAllocator("alloc.so", "my_malloc", "my_free")
    with pytest.raises(NotImplementedError, match="change_current_allocator"):
        torch.cuda.memory.change_current_allocator(object())
    torch.zeros(10, device="cuda")
    with pytest.raises(RuntimeError, match="^Can't swap an already initialized allocator$"):
        torch.cuda.memory.change_current_allocator(object())


def test_alloc_conf_forms_of_the_notes() -> None:
    conf = AllocatorConfig.parse("max_split_size_mb:64,"
                                 "roundup_power2_divisions:[256:1,512:2,1024:4,>:8],"
                                 "garbage_collection_threshold:0.8")
    assert conf.max_split_size == 64 << 20
    assert conf.garbage_collection_threshold == 0.8
    # the notes' rounding: 1200 (MB here) with 4 divisions of [1024, 2048) is 1280
    four = AllocatorConfig.parse("roundup_power2_divisions:4")
    assert round_size(1200 << 20, four) == 1280 << 20
