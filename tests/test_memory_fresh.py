"""`devlab.memory.run_fresh`: a function run in a new process under chosen memory settings."""

from __future__ import annotations

import time

import pytest
import torch

import devlab
from devlab.core.memory_watch import FreshRun, run_fresh
from devlab.engine import simulated
from devlab.engine.gpu_model import capacity

MiB = 1024**2


def _four_blocks() -> int:
    blocks = []
    for _ in range(4):
        blocks.append(torch.ones(8, 1024, 1024, device="cuda"))  # 32 MiB
        time.sleep(0.03)
    return torch.cuda.memory_reserved()


def test_growth_off_reserves_nine_tenths_of_free_memory_at_first_use() -> None:
    simulating, initialized = simulated.is_active(), devlab.runtime.is_initialized()
    run = run_fresh(_four_blocks, model="T4", growth=False)
    spec = simulated.gpu_spec("T4")
    total = capacity.total_memory(spec)
    free = total - capacity.context_bytes(spec)
    assert isinstance(run, FreshRun) and run.model == "T4" and run.growth is False
    assert run.limit() == total
    # The child's own torch.cuda.memory_reserved agrees with the sampled readings.
    assert run.value == run.peak_reserved()
    assert 0.9 * free <= run.peak_reserved() <= 0.9 * free + 2 * MiB
    assert run.peak_allocated() == 4 * 32 * MiB
    readings = next(iter(run.series.values()))
    assert [r.timestamp for r in readings] == sorted(r.timestamp for r in readings)
    # This process was left as it was.
    assert (simulated.is_active(), devlab.runtime.is_initialized()) == (simulating, initialized)


def test_growth_on_reserves_only_what_the_tensors_need() -> None:
    run = run_fresh(_four_blocks, model="T4", growth=True, memory_limit=512)
    assert run.peak_allocated() == run.peak_reserved() == run.value == 4 * 32 * MiB
    assert run.limit() == 512 * MiB  # devlab reads a memory limit in MiB, as TensorFlow does
    readings = next(iter(run.series.values()))
    # Sampled as it grew: readings in between empty and full, not only the two ends.
    assert {r.used for r in readings} > {0, 4 * 32 * MiB}
    fig = run.plot()
    assert "growth on" in fig.axes[0].get_title()


def _fails() -> None:
    raise ValueError("boom in the child")


def test_an_error_in_fn_comes_back_with_its_traceback() -> None:
    with pytest.raises(RuntimeError, match="boom in the child"):
        run_fresh(_fails)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"fn": 3}, "fn must be a function"),
    ({"growth": "off"}, "growth must be True"),
    ({"gpus": 0}, "gpus must be"),
    ({"memory_limit": -5}, "memory_limit must be a positive"),
    ({"interval": 5}, "interval must be"),
    ({"timeout": 0}, "timeout must be"),
    ({"model": "Z9000"}, "Z9000"),
])
def test_bad_arguments_are_named(kwargs: dict, match: str) -> None:
    fn = kwargs.pop("fn", _four_blocks)
    with pytest.raises((TypeError, ValueError), match=match):
        run_fresh(fn, **kwargs)


def _sleeps() -> None:
    time.sleep(60)


def test_timeout_stops_the_process() -> None:
    t = time.perf_counter()
    with pytest.raises(TimeoutError, match="within 4 s"):
        run_fresh(_sleeps, timeout=4)
    assert time.perf_counter() - t < 30  # stopped, not waited for
