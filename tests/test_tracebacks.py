"""The one rule for whose frame a line is (devlab._helpers.tracebacks.whose), on the files real frames
name: the user's cell and script, an installed library, devlab's own files, torch's, the
standard library's, frozen and generated code; and the tracebacks cut with it."""

from __future__ import annotations

import importlib._bootstrap
import os
import sys
import sysconfig
from pathlib import Path

import IPython
import numpy
import pytest
import torch

import devlab
import devlab.core.timing
import devlab.engine.simulated.base.cuda_errors
from devlab._helpers import tracebacks as _tracebacks
from devlab._helpers.tracebacks import devlab_file, drop_frames, is_user_file, whose


def cell_names() -> list[str]:
    """The file names IPython and ipykernel give a cell's code, made by their own compilers."""
    from IPython.core.compilerop import CachingCompiler

    names = [CachingCompiler().get_code_name("x = 1\n", "x = 1\n", 3)]
    try:
        from ipykernel.compiler import XCachingCompiler
    except ImportError:
        pass
    else:
        names.append(XCachingCompiler().get_code_name("x = 1\n", "x = 1\n", 4))
    return names


def test_a_cell_and_the_users_own_script_are_the_users(tmp_path: Path):
    for name in cell_names():
        assert whose(name) == "user", name
    assert whose("/tmp/ipython-input-12-3456789.py") == "user"  # Colab's cells
    assert whose("<stdin>") == "user"
    script = tmp_path / "train.py"
    script.write_text("import sys\nframe = sys._getframe()\n")
    scope: dict = {}
    exec(compile(script.read_text(), str(script), "exec"), scope)
    assert whose(scope["frame"].f_code.co_filename) == "user"
    assert whose(sys._getframe().f_code.co_filename) == "user"  # this test: not devlab's
    assert is_user_file(str(script))


def test_installed_libraries_torch_and_the_standard_library_are_not():
    for module in (torch.nn.modules.linear, numpy, IPython, os, sysconfig):
        assert whose(module.__file__) == "library", module
    # another machine's (a snapshot recorded elsewhere)
    for name in ("/usr/local/lib/python3.11/site-packages/transformers/modeling_utils.py",
                 "/usr/lib/python3/dist-packages/numpy/core/numeric.py",
                 "/opt/conda/lib/python3.10/contextlib.py",
                 "C:/Python311/Lib/contextlib.py"):
        assert whose(name) == "library", name
        assert not is_user_file(name)


def test_devlab_files_are_devlabs_and_named_by_their_room():
    assert whose(devlab.__file__) == "devlab"
    assert whose(devlab.core.timing.__file__) == "devlab"
    assert devlab_file(devlab.core.timing.__file__) == "core/timing.py"
    assert devlab_file(devlab.engine.simulated.base.cuda_errors.__file__) == \
        "engine/simulated/base/cuda_errors.py"
    assert devlab_file(torch.__file__) is None
    assert devlab_file("<frozen runpy>") is None
    assert not is_user_file(devlab.__file__)


def test_frozen_generated_and_native_frames_are_generated():
    frozen = importlib._bootstrap._find_and_load.__code__.co_filename
    assert frozen.startswith("<frozen")
    generated = compile("x = 1", "<string>", "exec").co_filename
    for name in (frozen, generated, "<eval_with_key>.3", "", "??",
                 "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "c10/core/TensorImpl.h"):
        assert whose(name) == "generated", name
        assert not is_user_file(name)


def test_the_library_dirs_include_a_torch_outside_site_packages(monkeypatch, tmp_path: Path):
    """A source checkout of torch is torch's, not the user's, wherever it lives."""
    checkout = tmp_path / "pytorch" / "torch"
    checkout.mkdir(parents=True)
    fake = type(sys)("torch")
    fake.__file__ = str(checkout / "__init__.py")
    monkeypatch.setitem(sys.modules, "torch", fake)
    _tracebacks._library_dirs.cache_clear()
    _tracebacks.whose.cache_clear()
    try:
        assert whose(str(checkout / "nn" / "functional.py")) == "library"
    finally:
        monkeypatch.undo()
        _tracebacks._library_dirs.cache_clear()
        _tracebacks.whose.cache_clear()


def test_drop_frames_keeps_only_the_frames_it_is_not_told_to_drop(tmp_path: Path):
    lib = tmp_path / "lib.py"
    lib.write_text("def inner():\n    raise ValueError('bad')\n")
    scope: dict = {}
    exec(compile(lib.read_text(), str(lib), "exec"), scope)
    with pytest.raises(ValueError) as info:
        scope["inner"]()
    err = info.value
    names = [f.filename for f in __import__("traceback").extract_tb(err.__traceback__)]
    assert str(lib) in names
    drop_frames(err, lambda filename: filename == str(lib))
    names = [f.filename for f in __import__("traceback").extract_tb(err.__traceback__)]
    assert names and str(lib) not in names and names[0] == __file__
