"""`torch.cuda.random` for simulated GPUs: seeding and the generator's state, as torch keeps
them in torch/cuda/random.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from devlab.engine.simulated.base.cuda_errors import entry
from devlab.engine.simulated.cuda.device_api import device_count, initializes


# Simulated GPUs compute on the CPU, so they draw from the CPU generator: seeding "the GPUs"
# seeds it, and the same seed gives the same values as the same code on the CPU.
@entry
def manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


@entry
def seed() -> None:
    torch.default_generator.seed()


@entry
@initializes
def initial_seed() -> int:
    return torch.default_generator.initial_seed()


@entry
@initializes
def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    return torch.get_rng_state()


@entry
def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    torch.set_rng_state(new_state)


@entry
@initializes
def get_rng_state_all() -> list[torch.Tensor]:
    return [torch.get_rng_state() for _ in range(device_count())]


@entry
def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    if new_states:
        torch.set_rng_state(new_states[0])


CUDA_FUNCS: dict[str, Callable[..., Any] | type] = {
    "manual_seed": manual_seed,
    "manual_seed_all": manual_seed,
    "seed": seed,
    "seed_all": seed,
    "initial_seed": initial_seed,
    "get_rng_state": get_rng_state,
    "set_rng_state": set_rng_state,
    "get_rng_state_all": get_rng_state_all,
    "set_rng_state_all": set_rng_state_all,
}
