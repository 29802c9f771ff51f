"""Former module names (before the fronts/core/engine layout) import as the modules at their new
places: one module object under both names, whose own spec keeps its new name."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys

import pytest

import devlab
from devlab._helpers import former_names
from devlab.core.names import DeviceSpec


@pytest.mark.parametrize("former, current", [
    ("devlab.config", "devlab.core.config"),
    ("devlab.names", "devlab.core.names"),
    ("devlab.memory", "devlab.core.memory_watch"),
    ("devlab.memory.timeline", "devlab.core.memory_watch.allocation_timeline"),
    ("devlab.simulated.core.session", "devlab.engine.simulated.base.session"),
    ("devlab.distributed.wire", "devlab.core.ranks.handoff"),
])
def test_a_former_name_is_the_module_at_its_new_place(former, current):
    module = importlib.import_module(former)
    assert module is importlib.import_module(current)
    assert module.__spec__.name == current  # its own spec, not the former name's


def test_every_former_name_reaches_a_module():
    for former in former_names.FORMER:
        if former == "devlab.pytest_plugin":
            continue  # a front loaded by pytest's entry point, imported only under pytest
        assert importlib.import_module(former).__name__ == former_names.current_name(former)


def test_a_name_that_never_existed_is_still_not_found():
    assert former_names.current_name("devlab.no_such_room") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("devlab.no_such_room")


def test_a_pickle_naming_a_former_module_loads():
    spec = DeviceSpec.from_string("/GPU:1")
    data = pickle.dumps(spec, protocol=2)  # protocol 2 names classes as text: module\nname
    assert b"devlab.core.names" in data
    former = data.replace(b"devlab.core.names", b"devlab.names")
    assert pickle.loads(former) == spec


def test_old_style_imports_work_in_a_fresh_process():
    code = ("from devlab.memory import run_fresh; import devlab.config as c; "
            "from devlab.simulated.clock.clock import Clock; import devlab; "
            "print(c is devlab.config, run_fresh.__module__, Clock.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "devlab.core.memory_watch.fresh_process",
                                  "devlab.engine.gpu_model.modeled_clock"]
    assert devlab.config is importlib.import_module("devlab.core.config")


def test_a_former_module_leaves_its_packages_attribute_of_that_name_alone():
    # devlab.memory.timeline was a module beside the function devlab.memory.timeline; importing
    # the module by its former name must not bind it over the function (nor did it before).
    code = ("import importlib, devlab.memory.timeline; import devlab.core.memory_watch as m; "
            "t = importlib.import_module('devlab.memory.timeline'); "
            "from devlab.memory.timeline import AllocationTimeline; "
            "print(t.__name__, type(m.timeline).__name__, AllocationTimeline.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["devlab.core.memory_watch.allocation_timeline", "function",
                                  "devlab.core.memory_watch.allocation_timeline"]


def test_the_widgets_are_an_attribute_of_devlab_as_the_readme_names_them():
    # README and lesson 02 name `devlab.widgets.MemoryMonitor`: after a bare `import devlab`
    # it must resolve, without importing ipywidgets until it is asked for.
    code = ("import sys, devlab; before = 'ipywidgets' in sys.modules; "
            "print(before, devlab.widgets.MemoryMonitor.__module__, devlab.widgets.TimingChart.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "devlab.fronts.lab.widgets.memory_monitor", "TimingChart"]
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        devlab.no_such_name  # noqa: B018
