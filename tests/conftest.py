"""Every test starts and ends with devlab and torch in their normal state."""

from __future__ import annotations

import os

import pytest
import torch

import devlab

# Each pytest worker, with the kernels and processes it starts, is a simulated machine of its
# own: on one host, two workers' lessons would otherwise count each other's memory in NVML and
# nvidia-smi, as two notebooks on one real machine do (devlab.engine.simulated.base.machine).
# (Set, not defaulted: pytest-xdist's workers inherit the controller's environment, where this
# file ran first.)
os.environ["DEVLAB_SIMULATED_MACHINE"] = (
    f"tests-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}")

# The corpus holds third-party programs (some named test_*.py, pytest suites of their own, like
# accelerate's): tests/test_conformance.py runs them as their users do, pytest must not collect them.
collect_ignore_glob = ["conformance/programs/*", "conformance/standins*"]


def _torch_state() -> tuple[object, ...]:
    return (
        torch.get_default_device(),
        torch._C._len_torch_function_stack(),
        torch._C._len_torch_dispatch_stack(),
        torch._tensor_str._str,
    )


@pytest.fixture(autouse=True)
def clean_devlab():
    devlab.config.reset()
    devlab.debugging.reset()
    before = _torch_state()
    yield
    devlab.debugging.reset()
    devlab.core.placement_scope.reset_default()
    devlab.config.reset()
    assert _torch_state() == before, "a test left torch changed"


@pytest.fixture
def no_simulation():
    """The simulation is off before and after the test, and the runtime uninitialized."""
    devlab.simulated.stop()
    devlab.runtime.reset()
    yield
    devlab.simulated.stop()
    devlab.runtime.reset()
    assert not devlab.simulated.is_active()


@pytest.fixture
def modeled_host(monkeypatch):
    """The host's modeled time moves by the modeled costs alone (DEVLAB_HOST_CLOCK=modeled, set
    before the simulation starts and inherited by ranks it launches): for tests of the model's
    arithmetic, whose figures must not depend on how fast this machine runs the test's own
    Python. Tests of the host's wall-clock time (tests/test_host_clock.py) leave it out."""
    monkeypatch.setenv("DEVLAB_HOST_CLOCK", "modeled")


@pytest.fixture
def two(no_simulation):
    """Two simulated GPUs for the test."""
    devlab.simulated.start(2)
    return devlab.simulated
