"""`nn.DataParallel` and `nn.parallel.scatter/gather/replicate` on simulated GPUs.

torch implements them with CUDA-only kernels (`torch._C._scatter`, `_broadcast_coalesced`, ...)
wrapped in autograd Functions that use CUDA streams. On simulated GPUs the same results come
from ordinary differentiable ops: a scatter is a split plus one `.to(device)` per chunk, a
gather is `.to(target)` plus `cat`, a broadcast is one `.to(device)` per GPU. Autograd then
sends gradients back across the copies by itself, which is what the CUDA Functions' backward
passes do by hand. Replicas run in one thread each, with the routing mode of their own.
"""

from __future__ import annotations

import importlib
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.cuda.comm  # noqa: F401 - loaded now, so start() patches it without importing it
from torch._utils import ExceptionWrapper

from devlab.engine.simulated.base import device_args as _devices
from devlab.engine.simulated.base import session as _session
from devlab.engine.simulated.base.patcher import Patcher

Tensor = torch.Tensor


def _gpu(device: Any) -> torch.device:
    _, index = _devices.parse(device)
    return torch.device("cuda", _devices.checked_ordinal(
        _session.current_device() if index is None else int(index)))


def _target(device: Any) -> torch.device:
    if device == "cpu" or device == -1:
        return torch.device("cpu")
    return _gpu(device)


class Scatter:
    """Stands in for torch.nn.parallel._functions.Scatter."""

    @staticmethod
    def apply(target_gpus: Sequence[Any], chunk_sizes: Sequence[int] | None, dim: int,
              input: Tensor) -> tuple[Tensor, ...]:
        devices = [_gpu(d) for d in target_gpus]
        chunks = (input.split(list(chunk_sizes), dim) if chunk_sizes is not None
                  else input.chunk(len(devices), dim))
        return tuple(c.to(d) for c, d in zip(chunks, devices, strict=False))


class Gather:
    """Stands in for torch.nn.parallel._functions.Gather."""

    @staticmethod
    def apply(target_device: Any, dim: int, *inputs: Tensor) -> Tensor:
        target = _target(target_device)
        if all(t.dim() == 0 for t in inputs) and dim == 0:
            inputs = tuple(t.view(1) for t in inputs)
            warnings.warn("Was asked to gather along dimension 0, but all input tensors were "
                          "scalars; will instead unsqueeze and return a vector.", stacklevel=2)
        return torch.cat([t.to(target) for t in inputs], dim)


class Broadcast:
    """Stands in for torch.nn.parallel._functions.Broadcast."""

    @staticmethod
    def apply(target_gpus: Sequence[Any], *inputs: Tensor) -> tuple[Tensor, ...]:
        return tuple(t.to(d) for d in map(_gpu, target_gpus) for t in inputs)


# torch.nn.parallel.comm (also torch.cuda.comm)

def broadcast(tensor: Tensor, devices: Sequence[Any] | None = None, *,
              out: Sequence[Tensor] | None = None) -> tuple[Tensor, ...]:
    if out is not None:
        for o in out:
            o.copy_(tensor)
        return tuple(out)
    return tuple(tensor.to(_gpu(d), copy=True) for d in devices or ())


def broadcast_coalesced(tensors: Sequence[Tensor], devices: Sequence[Any],
                        buffer_size: int = 10485760) -> list[list[Tensor]]:
    # As CUDA's: the first device is the tensors' own, and gets the tensors themselves.
    devs = [_gpu(d) for d in devices]
    return [list(tensors) if i == 0 else [t.to(d, copy=True) for t in tensors]
            for i, d in enumerate(devs)]


def reduce_add(inputs: Sequence[Tensor], destination: Any = None) -> Tensor:
    target = _target(destination) if destination is not None else _gpu(None)
    out = inputs[0].to(target, copy=True)
    for t in inputs[1:]:
        out += t.to(target)
    return out


def reduce_add_coalesced(inputs: Sequence[Sequence[Tensor]], destination: Any = None,
                         buffer_size: int = 10485760) -> tuple[Tensor, ...]:
    return tuple(reduce_add(list(group), destination) for group in zip(*inputs, strict=True))


def scatter(tensor: Tensor, devices: Sequence[Any] | None = None,
            chunk_sizes: Sequence[int] | None = None, dim: int = 0, streams: Any = None, *,
            out: Sequence[Tensor] | None = None) -> tuple[Tensor, ...]:
    if out is not None:
        sizes = [o.size(dim) for o in out]
        for o, c in zip(out, tensor.split(sizes, dim), strict=True):
            o.copy_(c)
        return tuple(out)
    with torch.no_grad():
        return Scatter.apply(devices or (), chunk_sizes, dim, tensor)


def gather(tensors: Sequence[Tensor], dim: int = 0, destination: Any = None, *,
           out: Tensor | None = None) -> Tensor:
    if out is not None:
        return torch.cat([t.to(out.device) for t in tensors], dim, out=out)
    with torch.no_grad():
        return Gather.apply(-1 if destination == -1 else destination, dim, *tensors)


def parallel_apply(modules: Sequence[torch.nn.Module], inputs: Sequence[Any],
                   kwargs_tup: Sequence[dict[str, Any]] | None = None,
                   devices: Sequence[Any] | None = None) -> list[Any]:
    """Run each replica in a thread of its own, routed like the starting thread."""
    if len(modules) != len(inputs):
        raise AssertionError(f"The number of modules {len(modules)} is not equal to the "
                             f"number of inputs {len(inputs)}")
    kwargs_tup = kwargs_tup if kwargs_tup is not None else ({},) * len(modules)
    devices = devices if devices is not None else [None] * len(modules)
    grad_enabled = torch.is_grad_enabled()
    results: dict[int, Any] = {}
    lock = threading.Lock()

    def worker(i: int, module: torch.nn.Module, input: Any, kwargs: dict[str, Any],
               device: Any) -> None:
        torch.set_grad_enabled(grad_enabled)
        try:
            # A thread started while simulating is routed (_threads); a one-replica call runs
            # here, in the caller's routed thread.
            if device is None:
                t = _module("torch.nn.parallel.parallel_apply").get_a_var(input)
                device = t.get_device() if t is not None else None
            index = _gpu(device).index
            prev = _session.current_device()
            _session.tls.device = index
            try:
                args = input if isinstance(input, (list, tuple)) else (input,)
                output = module(*args, **kwargs)
            finally:
                _session.tls.device = prev
            with lock:
                results[i] = output
        except Exception:
            with lock:
                results[i] = ExceptionWrapper(where=f"in replica {i} on device {device}")

    threads = [threading.Thread(target=worker, args=(i, m, x, kw, d))
               for i, (m, x, kw, d) in enumerate(zip(modules, inputs, kwargs_tup, devices,
                                                     strict=True))]
    if len(threads) == 1:
        threads[0].run()
    else:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    outputs = []
    for i in range(len(modules)):
        out = results[i]
        if isinstance(out, ExceptionWrapper):
            out.reraise()
        outputs.append(out)
    return outputs


def _module(name: str) -> Any:
    # sys.modules, not attribute access: torch.nn.parallel.parallel_apply is also the name of
    # a function that the package re-exports over its submodule.
    importlib.import_module(name)
    return sys.modules[name]


def install(p: Patcher) -> None:
    par, fn, comm, dp, pa, sg = (_module("torch.nn.parallel" + n) for n in (
        "", "._functions", ".comm", ".data_parallel", ".parallel_apply", ".scatter_gather"))

    for mod in (fn, sg):
        p.set(mod, "Scatter", Scatter)
        p.set(mod, "Gather", Gather)
    p.set(fn, "Broadcast", Broadcast)
    cuda_comm = _module("torch.cuda.comm")  # re-exports the same functions under CUDA's name
    for name, f in (("broadcast", broadcast), ("broadcast_coalesced", broadcast_coalesced),
                    ("reduce_add", reduce_add), ("reduce_add_coalesced", reduce_add_coalesced),
                    ("scatter", scatter), ("gather", gather)):
        p.set(comm, name, f)
        if name in vars(cuda_comm):
            p.set(cuda_comm, name, f)
    for mod in (par, pa, dp):
        p.set(mod, "parallel_apply", parallel_apply)
