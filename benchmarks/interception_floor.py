"""What any interception of torch's calls costs at least, beside what the simulation costs
(issue 39: a small op and a tensor's life on a simulated GPU at most 3x the CPU's).

Run: .venv/bin/python benchmarks/interception_floor.py [--quick] [--rounds N]

Times `a + b` on 8x8 tensors and `torch.empty(1000)` made and dropped, one CPU thread, the
variants interleaved round by round (medians of the rounds, each the best of three runs), as
ratios to plain CPU PyTorch in the same run:

- `empty Python mode`: a `TorchFunctionMode` whose `__torch_function__` only calls the
  function: the floor of any Python-level interception (torch's override check, the mode
  popped and pushed, the call's tuple and dict, one Python frame);
- `native stand-in`: the same mode with a compiled `__torch_function__`
  (benchmarks/interception_floor.c, built here with the system's C compiler into a temporary
  folder removed at exit) doing what the simulation's fast path does around the call
  (torch's three stack and hook questions, each tensor argument's storage and mark, the
  output storage's mark as a weakref with a native callback, a counting allocator, the
  callback as the free), CUDA's caching allocator left out: what a compiled hot path would
  cost at least;
- `simulated GPU` and `modeled T4`: devlab's simulation as it is (the mode's fast path).

Without a C compiler (or Python's headers) the native row says why it was not measured. Every
figure is this CPU's: a simulated GPU is the CPU, and none of these is a GPU's time.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import op_cost  # noqa: E402  (its cases, timer and simulation switch: one definition of each)
import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

CASES = ("small op", "tensor life")


class EmptyMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202
        return func(*args, **(kwargs or {}))


def build_native(folder: Path) -> types.ModuleType | str:
    """The compiled stand-in, built in `folder`, or why it could not be built."""
    cc = shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) or shutil.which("cc")
    include = sysconfig.get_paths()["include"]
    if cc is None:
        return "no C compiler on PATH"
    if not (Path(include) / "Python.h").exists():
        return f"no Python.h in {include} (Python's headers are not installed)"
    out = folder / ("interception_floor" + sysconfig.get_config_var("EXT_SUFFIX"))
    proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", f"-I{include}",
                           str(HERE / "interception_floor.c"), "-o", str(out)],
                          capture_output=True, text=True)
    if proc.returncode:
        return f"the compiler failed: {proc.stderr.strip()[-300:]}"
    loader = importlib.machinery.ExtensionFileLoader("interception_floor", str(out))
    spec = importlib.util.spec_from_file_location("interception_floor", out, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    module.setup(torch.Tensor, torch.nn.Parameter, torch._C._len_torch_function_stack,
                 torch._C._len_torch_dispatch_stack,
                 torch._C._autograd._top_saved_tensors_default_hooks)
    return module


def native_mode(native: types.ModuleType) -> TorchFunctionMode:
    """A function mode whose `__torch_function__` is the compiled one, bound to the mode
    (torch asks that the method's `__self__` be the mode)."""
    mode = TorchFunctionMode()
    mode.__torch_function__ = types.MethodType(native.torch_function, mode)  # type: ignore[method-assign]
    return mode


def one_round(native: types.ModuleType | None, quick: bool) -> dict[str, dict[str, float]]:
    scale = 4 if quick else 1
    out: dict[str, dict[str, float]] = {case: {} for case in CASES}
    for case in CASES:
        row = out[case]
        fn, n = op_cost._case(case, "cpu")
        n = max(1, n // scale)
        row["cpu"] = op_cost._us(fn, n)
        with EmptyMode():
            fn, _ = op_cost._case(case, "cpu")
            row["empty Python mode"] = op_cost._us(fn, n)
        if native is not None:
            with native_mode(native):
                fn, _ = op_cost._case(case, "cpu")
                row["native stand-in"] = op_cost._us(fn, n)
        for label, model in (("simulated GPU", None), ("modeled T4", "T4")):
            stop = op_cost._simulating(model, True)
            try:
                fn, _ = op_cost._case(case, "cuda:0")
                row[label] = op_cost._us(fn, n)
            finally:
                del fn
                stop()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a quarter of the repeats")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    opts = parser.parse_args(argv)
    if opts.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {opts.rounds}")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="devlab-floor-") as folder:
        native = build_native(Path(folder))
        why = None
        if isinstance(native, str):
            why, native = native, None
        rounds = [one_round(native, opts.quick) for _ in range(opts.rounds)]
        if native is not None:
            held, _, allocations, live = native.counts()
            # every stand-in mark died with its storage: the callback ran as a free would
            print(f"native stand-in: {allocations} marks made, {live} alive, {held} bytes held")
    for case in CASES:
        medians: dict[str, Any] = {k: statistics.median(r[case][k] for r in rounds)
                                   for k in rounds[0][case]}
        cpu = medians["cpu"]
        print(f"{case}:")
        for label, us in medians.items():
            print(f"  {label:<18} {us:7.2f} us  {us / cpu:5.2f}x the CPU")
        if why is not None:
            print(f"  {'native stand-in':<18} not measured: {why}")


if __name__ == "__main__":
    main()
