"""The instruments people watch a GPU with, made to see the simulated GPUs: torch.profiler's CUDA
activity (`profiler_kineto`, writing a Kineto trace with `kineto_trace`), NVML through pynvml
(`nvml_answers`) and `nvidia-smi` (`nvidia_smi`), the last two answering for every process of the
simulated machine from its register of GPU use (`base.machine`).

`install(patcher)` is part of the simulation's start: it names the machine (`machine_key`: the
group `DEVLAB_SIMULATED_MACHINE` names, inherited by children, default "shared", and the GPU
count and model, so that a second kernel simulating the same GPUs sees the first), starts publishing this process's GPU use, puts the
`nvidia-smi` launcher first on PATH and answers pynvml's calls; every change goes through the
undo log, so stop() removes the entry, the launcher and the answers. The top layer of the
simulation: it reads the session and the clock, and nothing below imports it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
import tempfile
from types import ModuleType
from typing import Any

from devlab.engine.simulated.base import machine

_state: dict[str, Any] = {}  # key, publisher, launcher folder, last description written


def key() -> str | None:
    """The running simulated machine's key (None: no simulation installed its instruments)."""
    return _state.get("key")


def _read() -> machine.Usage | None:
    from devlab.engine.simulated.instruments import nvml_answers as nv

    _write_description()
    usage, _ = nv.local_usage()
    return usage


def _write_description() -> None:
    """Keep the launcher's machine.json what the simulation is now (reconfigure() may change
    the GPUs after start)."""
    from devlab.engine.simulated.instruments import nvidia_smi as smi
    from devlab.engine.simulated.instruments import nvml_answers as nv

    folder, k = _state.get("launcher"), _state.get("key")
    if folder is None or k is None or os.getpid() != _state.get("pid"):
        return
    d = nv.local_description(k)
    if d is None:
        return
    text = d.to_json()
    if text != _state.get("written"):
        path = os.path.join(folder, smi.MACHINE_FILE)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
        _state["written"] = text


def _make_launcher() -> str:
    from devlab.engine.simulated.instruments import nvidia_smi as smi

    folder = tempfile.mkdtemp(prefix="devlab-nvidia-smi-")
    script = os.path.join(folder, smi.LAUNCHER)
    with open(script, "w", encoding="utf-8") as f:
        f.write(smi.launcher_script(sys.executable, os.path.join(folder, smi.MACHINE_FILE)))
    os.chmod(script, 0o700)
    return folder


def install(p: Any, count: int, model: str | None) -> None:
    """Start the instruments for the simulation being started (`p`: its undo log)."""
    from devlab.engine.simulated.base import fork_rule as _fork
    from devlab.engine.simulated.base.import_patches import when_imported

    k = machine.machine_key(count, model)
    if not os.environ.get(machine.ENV, "").strip():  # children join this machine's group
        previous = os.environ.get(machine.ENV)
        os.environ[machine.ENV] = machine.DEFAULT_GROUP
        p.on_restore(functools.partial(_restore_env, machine.ENV, previous))
    folder = _make_launcher()
    _state.update(key=k, launcher=folder, pid=os.getpid(), written=None)
    p.on_restore(functools.partial(_remove_launcher, folder))
    _write_description()
    os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")
    p.on_restore(functools.partial(_remove_from_path, folder))
    publisher = machine.publish(k, _read, extra=[folder])
    p.on_restore(functools.partial(machine.unpublish, publisher))
    p.on_restore(_state.clear)
    # A forked rank that may use the GPUs it inherited publishes its own use.
    original = _fork.reset_for_rank

    @functools.wraps(original)
    def reset_for_rank() -> None:
        original()
        _publish_in_child()

    p.set(_fork, "reset_for_rank", reset_for_rank)
    when_imported(p, "pynvml", functools.partial(_answer_pynvml, p))


def _publish_in_child() -> None:
    k = _state.get("key")
    if k is None or machine.publishing():
        return
    machine.publish(k, _read)


def _after_fork_in_child() -> None:
    from devlab.engine.simulated.base import session as _session

    if _state.get("key") is not None and _session.session is not None and not _session.bad_fork:
        _publish_in_child()


def _answer_pynvml(p: Any, module: ModuleType) -> None:
    """Point pynvml at the simulated library (See `nvml_answers`)."""
    from devlab.engine.simulated.instruments import nvml_answers as nv

    if not all(hasattr(module, n) for n in ("nvmlLib", "_nvmlGetFunctionPointer_cache",
                                            "_nvmlLib_refcount")):
        return  # a pynvml unlike nvidia-ml-py's: left as it is
    library = nv.SimulatedNvml(_view)
    p.set(module, "_nvmlGetFunctionPointer_cache", {})
    p.set(module, "_nvmlLib_refcount", 0)
    p.set(module, "nvmlLib", library)


def _view() -> Any:
    from devlab.engine.simulated.instruments import nvml_answers as nv

    k = _state.get("key")
    return nv.local_view(k) if k is not None else None


def view() -> Any:
    """NVML's view of the simulated machine now (`nvml_answers.View`; None: no simulation)."""
    return _view()


def used_on(index: int) -> int | None:
    """What NVML counts in use on simulated GPU `index` (nvidia-smi's "Memory-Usage": every
    process's CUDA context, reserved memory and libraries' buffers); None without a model,
    whose GPUs have no context (NVML's figure would be the allocator's reserved)."""
    v = _view()
    if v is None or not 0 <= index < len(v.boards) or not v.boards[index].modeled:
        return None
    return v.used(index)


def _restore_env(name: str, previous: str | None) -> None:
    if previous is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = previous


def _remove_from_path(folder: str) -> None:
    parts = os.environ.get("PATH", "").split(os.pathsep)
    os.environ["PATH"] = os.pathsep.join(x for x in parts if x != folder)


def _remove_launcher(folder: str) -> None:
    with contextlib.suppress(OSError):
        shutil.rmtree(folder)


def _at_exit() -> None:
    folder = _state.get("launcher")
    if folder is not None and os.getpid() == _state.get("pid"):
        _remove_launcher(folder)


import atexit  # noqa: E402 - registered after the functions it names

atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
