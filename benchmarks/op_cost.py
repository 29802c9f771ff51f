"""What a simulated op costs against the same op on plain CPU PyTorch (issue 39).

Run: .venv/bin/python benchmarks/op_cost.py [--quick] [--rounds N] [--before TREE]
     [--short-batches]

Prints, as ratios to plain CPU PyTorch measured in the same run (one CPU thread, the CPU and
each simulated variant interleaved round by round, the median of the rounds):

- the work of issue 39: a small op (`a + b` on 8x8), a tensor's life (`torch.empty(1000)`
  made and dropped), the d2l loop of ten 100x100 products and Frobenius norms, an MLP step
  (3 x Linear 512, batch 64, Adam), and a 1024x1024 product (no regression: within 1.1x);
  each on a simulated GPU and on a modeled T4, with the mode's fast path on (`after`) and
  forced off (`full path`, Note [The mode's fast path] in devlab/engine/simulated/mode/
  routing.py), against the targets;
- the per-op overhead of `a + b` (simulated minus CPU, microseconds) against the number of
  live tensors on the GPU (10 to 100,000) and the number of simulated GPUs (1 to 8);
  `--ranks` alone: against the number of processes on the simulated machine (1 to 8: this
  one and idle ranks holding memory, each on the machine's register).

`--short-batches` times each figure as the best of 30 runs of a twentieth of its repeats (not
the best of 3 runs of all of them): on a loaded machine, a figure nearer the quiet one.
`--before TREE` also runs each round in a fresh process with TREE's devlab (a checkout of the
code before a change, e.g. /work/main) first on the import path, interleaved with this tree's,
and prints both. A simulated GPU is this CPU: none of these figures is a GPU's.

Wall time on a loaded machine moves with the load; instructions do not. `--callgrind CASE MODE
N` runs only N repeats of one case (add, life, loop, mlp, mm1024; MODE cpu, simulated or T4)
inside `operator.call`, after 200 warm-up repeats, so that callgrind counts those alone:

    PYTHONHASHSEED=0 valgrind --tool=callgrind --collect-atstart=no \\
        --toggle-collect=_operator_call --callgrind-out-file=add.T4.out \\
        .venv/bin/python benchmarks/op_cost.py --callgrind add T4 2000
    callgrind_annotate add.T4.out  # the summary's total over N: instructions per repeat

`--layers` (it takes no file) times each layer of `a + b` alone instead, in microseconds per
repeat, interleaved round by round (`--rounds`): an empty function mode's entry, the
allocator's allocate and free, a mark and its death, the clock's charge, and routing as what is
left of the total; docs/op-cost.md shows them. `--profile CASE MODE` splits cProfile's time of
one case by the same layers.
"""

from __future__ import annotations

import argparse
import gc
import json
import operator
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if "DEVLAB_BENCH_TREE" not in os.environ:  # --before's children name their own tree
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import devlab  # noqa: E402
from devlab.engine import simulated  # noqa: E402

try:  # a tree before the fast path has no switch: it runs the full path only
    from devlab.engine.simulated.mode import routing as _routing
    HAS_FAST = hasattr(_routing, "fast_path")
except ImportError:  # pragma: no cover - an older layout
    _routing = None
    HAS_FAST = False

# Issue 39's targets: ratio to plain CPU on a simulated GPU, and on a modeled T4.
TARGETS = {"small op": (3.0, 3.5), "tensor life": (3.0, 3.0), "100x100 loop": (2.0, 2.5),
           "MLP step": (1.5, 1.7), "1024^2 matmul": (1.1, 1.1)}


# The short names --callgrind and --profile take for the cases.
_CASE_NAMES = {"add": "small op", "life": "tensor life", "loop": "100x100 loop",
               "mlp": "MLP step", "mm1024": "1024^2 matmul"}


def _case(name: str, device: str) -> tuple[Callable[[], object], int]:
    """(one repeat of the case on `device`, how many repeats make a measurement)."""
    torch.manual_seed(0)
    if name == "small op":
        a = torch.randn(8, 8, device=device)
        b = torch.randn(8, 8, device=device)
        return (lambda: a + b), 4000
    if name == "tensor life":
        return (lambda: torch.empty(1000, device=device)), 4000
    if name == "100x100 loop":
        x = torch.randn(100, 100, device=device)

        def loop() -> None:
            for _ in range(10):
                torch.linalg.norm(x @ x)
        return loop, 100
    if name == "MLP step":
        X = torch.randn(64, 512, device=device)
        y = torch.randn(64, 512, device=device)
        net = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                            nn.Linear(512, 512)).to(device)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        loss_fn = nn.MSELoss()

        def step() -> None:
            opt.zero_grad()
            loss_fn(net(X), y).backward()
            opt.step()
        return step, 20
    if name == "1024^2 matmul":
        m = torch.randn(1024, 1024, device=device)

        def product() -> None:
            m @ m
            if device != "cpu":
                torch.cuda.synchronize()
        return product, 5
    raise ValueError(f"unknown case {name!r}: one of {', '.join(TARGETS)}")


def _us(fn: Callable[[], object], number: int) -> float:
    """Microseconds per repeat: the best of three runs of `number` (after a warm-up)."""
    for _ in range(max(1, number // 10)):
        fn()
    runs, number = (3, number) if not short_batches else (30, max(1, number // 20))
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best / number * 1e6


# --short-batches: the best of 30 runs of a twentieth of the repeats, not of 3 runs of all of
# them: on a loaded machine a short run is more often one the scheduler left alone.
short_batches = False


# The variants of one round: (label, GPU model or "cpu", fast path on)
VARIANTS = [("cpu", "cpu", None), ("simulated", None, True), ("simulated, full path", None, False),
            ("T4", "T4", True), ("T4, full path", "T4", False)]


def _simulating(model: str | None, fast: bool | None, gpus: int = 1) -> Callable[[], None]:
    simulated.start(gpus, model=model)
    if HAS_FAST and fast is not None:
        _routing.fast_path = fast

    def stop() -> None:
        if HAS_FAST:
            _routing.fast_path = True
        simulated.stop()
    return stop


def one_round(quick: bool) -> dict[str, dict[str, float]]:
    """One interleaved round: every case in every variant, microseconds per repeat."""
    out: dict[str, dict[str, float]] = {}
    scale = 4 if quick else 1
    for case in TARGETS:
        row = out[case] = {}
        for label, model, fast in VARIANTS:
            if fast is False and not HAS_FAST:
                continue
            if model == "cpu":
                fn, n = _case(case, "cpu")
                row[label] = _us(fn, max(1, n // scale))
                continue
            stop = _simulating(model, fast)
            try:
                fn, n = _case(case, "cuda:0")
                row[label] = _us(fn, max(1, n // scale))
            finally:
                del fn
                stop()
            gc.collect()
    return out


def scaling(quick: bool) -> dict[str, dict[int, float]]:
    """Per-op overhead of `a + b` (8x8; simulated minus CPU, microseconds) against the live
    tensors on the GPU and the number of simulated GPUs."""
    n = 1000 if quick else 4000

    def overhead(device: str, live: int) -> float:
        keep = [torch.empty(16, device=device) for _ in range(live)]
        a = torch.randn(8, 8, device=device)
        b = torch.randn(8, 8, device=device)
        t = _us(lambda: a + b, n)
        del keep
        return t

    res: dict[str, dict[int, float]] = {"live tensors": {}, "simulated GPUs": {}}
    for live in (10, 1000, 10_000, 100_000):
        cpu = overhead("cpu", live)
        stop = _simulating(None, True)
        try:
            res["live tensors"][live] = overhead("cuda:0", live) - cpu
        finally:
            stop()
    for gpus in (1, 2, 4, 8):
        cpu = overhead("cpu", 10)
        stop = _simulating(None, True, gpus)
        try:
            res["simulated GPUs"][gpus] = overhead(f"cuda:{gpus - 1}", 10) - cpu
        finally:
            stop()
    return res


_RANK = """
import sys, torch, devlab
from devlab.engine import simulated
simulated.start(1, model=sys.argv[1] if sys.argv[1] != "none" else None)
keep = [torch.randn(64, 64, device="cuda:0") for _ in range(8)]  # memory on the register
print("ready", flush=True)
sys.stdin.read()  # held until the benchmark closes the pipe
"""


def ranks(quick: bool, model: str | None = None) -> dict[int, float]:
    """Per-op overhead of `a + b` (8x8; simulated minus CPU, microseconds) in this process
    with N processes (this one and N - 1 idle ranks, 1 to 8) on one simulated machine, each
    publishing its memory on the machine's register (base/machine.py): what the register of
    processes costs an op."""
    from devlab.engine.simulated.base import machine

    n = 1000 if quick else 4000
    group = f"op-cost-{os.getpid()}"
    env = dict(os.environ, **{machine.ENV: group}, PYTHONPATH=str(ROOT))
    previous = os.environ.get(machine.ENV)
    os.environ[machine.ENV] = group
    out: dict[int, float] = {}
    children: list[subprocess.Popen] = []
    try:
        for count in (1, 2, 4, 8):
            while len(children) < count - 1:
                c = subprocess.Popen([sys.executable, "-c", _RANK, model or "none"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                children.append(c)
                if c.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
                    raise RuntimeError("a rank did not start")
            a, b = torch.randn(8, 8), torch.randn(8, 8)
            cpu = _us(lambda a=a, b=b: a + b, n)
            stop = _simulating(model, True)
            try:
                x = torch.randn(8, 8, device="cuda:0")
                y = torch.randn(8, 8, device="cuda:0")
                key = machine.machine_key(1, model)
                for _ in range(100):  # the ranks publish within their interval (50 ms)
                    others = [e for e in machine.entries(key) if e.pid != os.getpid()]
                    if len(others) >= count - 1:
                        break
                    time.sleep(0.05)
                else:
                    raise RuntimeError(f"the register lists {len(others)} of {count - 1} ranks")
                out[count] = _us(lambda x=x, y=y: x + y, n) - cpu
            finally:
                stop()
    finally:
        for c in children:
            c.stdin.close()  # type: ignore[union-attr]
            c.wait(timeout=60)
        if previous is None:
            os.environ.pop(machine.ENV, None)
        else:
            os.environ[machine.ENV] = previous
    return out


def _median_rounds(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, list]]:
    """Per case and variant: the median time and the median of the rounds' ratios to CPU."""
    out: dict[str, dict[str, list]] = {}
    for case in rounds[0]:
        out[case] = {}
        for label in rounds[0][case]:
            times = [r[case][label] for r in rounds]
            ratios = [r[case][label] / r[case]["cpu"] for r in rounds]
            out[case][label] = [statistics.median(times), statistics.median(ratios)]
    return out


def _print_table(title: str, med: dict[str, dict[str, list]]) -> None:
    print(f"\n{title}: microseconds per repeat (ratio to CPU; median of the rounds)")
    labels = list(next(iter(med.values())))
    print(f"{'work':15s}" + "".join(f"{lab:>24s}" for lab in labels) + "   targets (sim, T4)")
    for case, row in med.items():
        cells = "".join(f"{t:>14,.1f} ({r:5.2f}x)" if lab != "cpu" else f"{t:>24,.1f}"
                        for lab, (t, r) in row.items())
        sim_t, t4_t = TARGETS[case]
        met = []
        for lab, target in (("simulated", sim_t), ("T4", t4_t)):
            if lab in row:
                met.append(f"{'met' if row[lab][1] <= target else 'NOT met'} <= {target}x")
        print(f"{case:15s}{cells}   {', '.join(met)}")


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _child(quick: bool) -> None:
    """--round: one round, printed as JSON (for --before's interleaving)."""
    torch.set_num_threads(1)
    print(json.dumps(one_round(quick)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--before", metavar="TREE", help="also run TREE's devlab, interleaved")
    p.add_argument("--no-scaling", action="store_true", help="skip the overhead's growth")
    p.add_argument("--ranks", action="store_true",
                   help="only the per-op overhead with 1 to 8 ranks on the machine")
    p.add_argument("--short-batches", action="store_true",
                   help="time the best of 30 short runs (a loaded machine's better figure)")
    p.add_argument("--round", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--callgrind", nargs=3, metavar=("CASE", "MODE", "N"))
    p.add_argument("--layers", action="store_true", help="the per-layer breakdown of a + b")
    p.add_argument("--profile", nargs=2, metavar=("CASE", "MODE"),
                   help="cProfile's split of a case by layer (MODE simulated or T4)")
    opts = p.parse_args()
    global short_batches
    short_batches = opts.short_batches
    if opts.round:
        _child(opts.quick)
        return
    if opts.callgrind:
        case, mode, n = opts.callgrind
        callgrind_run(_CASE_NAMES.get(case, case), mode, int(n))
        return
    if opts.profile:
        case = _CASE_NAMES.get(opts.profile[0], opts.profile[0])
        shares = profile(case, opts.profile[1])
        print(f"{case} on {opts.profile[1]} ({Path(devlab.__file__).parent}): cProfile's "
              "own time by layer: " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
        return
    if opts.layers:
        torch.set_num_threads(1)
        print(f"devlab from {Path(devlab.__file__).parent}, load average {_load()}")
        for label, row in layers(opts.quick, opts.rounds).items():
            print(f"\n{label}: a + b (8x8), microseconds (median of {opts.rounds} rounds)")
            for k, v in row.items():
                print(f"  {k:16s} {v:6.2f}")
        return
    torch.set_num_threads(1)
    if opts.ranks:
        print(f"devlab from {Path(devlab.__file__).parent}, load average {_load()}")
        for model in (None, "T4"):
            row = ranks(opts.quick, model)
            print(f"per-op overhead of a + b (8x8), {model or 'simulated'}, us, by ranks on "
                  "the machine: " + "   ".join(f"{k}: {v:5.2f}" for k, v in row.items()))
        print(f"load average now {_load()}")
        return
    print(f"torch {torch.__version__}, devlab from {Path(devlab.__file__).parent}, 1 thread, "
          f"load average {_load()}; a simulated GPU is this CPU, no figure here is a GPU's")
    if opts.before:
        trees = {"before": Path(opts.before).resolve(), "after": ROOT}
        rounds: dict[str, list] = {k: [] for k in trees}
        for _ in range(opts.rounds):
            for label, tree in trees.items():  # one process per tree and round, alternating
                env = dict(os.environ, PYTHONPATH=str(tree), DEVLAB_BENCH_TREE=str(tree))
                argv = [sys.executable, str(Path(__file__).resolve()), "--round"]
                if opts.quick:
                    argv.append("--quick")
                if opts.short_batches:
                    argv.append("--short-batches")
                got = subprocess.run(argv, env=env, capture_output=True, text=True,
                                     check=True, cwd=tree)
                rounds[label].append(json.loads(got.stdout.strip().splitlines()[-1]))
        for label, tree in trees.items():
            _print_table(f"{label} ({tree})", _median_rounds(rounds[label]))
    else:
        rounds_here = [one_round(opts.quick) for _ in range(opts.rounds)]
        _print_table("this tree", _median_rounds(rounds_here))
    if not opts.no_scaling:
        s = scaling(opts.quick)
        print("\nper-op overhead of a + b (8x8) on a simulated GPU, simulated minus CPU, us")
        for what, row in s.items():
            print(f"  {what:15s} " + "   ".join(f"{k:>7,}: {v:5.2f}" for k, v in row.items()))
    print(f"\nload average now {_load()} (2 cores shared with other work: every figure moves "
          "with it; the ratios, measured side by side, least)")


# --- instruction counts -----------------------------------------------------------------------


def callgrind_run(case: str, mode: str, n: int) -> None:
    """200 warm-up repeats of `case`, then `n` inside `operator.call`, on one thread."""
    torch.set_num_threads(1)
    if mode != "cpu":
        simulated.start(1, model=None if mode == "simulated" else mode)
    try:
        fn, _ = _case(case, "cpu" if mode == "cpu" else "cuda:0")
        for _ in range(200 if case in ("small op", "tensor life") else 20):
            fn()

        def repeats() -> None:
            for _ in range(n):
                fn()
        getattr(operator, "call", lambda f: f())(repeats)
    finally:
        if mode != "cpu":
            simulated.stop()


def layers(quick: bool, rounds: int) -> dict[str, dict[str, float]]:
    """Microseconds per `a + b` (8x8) by layer, on a simulated GPU and a modeled T4: each layer
    timed alone in the same process, interleaved round by round (medians), the routing the
    rest. Layers: torch's C++ override check and the mode's entry (an empty function mode's
    cost over the bare op), the marking of the output's storage (a `Mark` and its death, with
    the allocator's calls taken out), the allocator (one allocate and one free of the same
    size), the clock (the modeled clock's charge for the op, and its enter and leave, twice:
    the op's and the free's), and routing (what is left: the mode's decisions, the device
    rule, the call)."""
    from torch.overrides import TorchFunctionMode

    from devlab.engine.gpu_model.caching_allocator import CachingAllocator
    from devlab.engine.simulated.base import storage_marks as marks

    n = 1000 if quick else 4000
    a, b = torch.randn(8, 8), torch.randn(8, 8)

    class Empty(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202
            return func(*args, **(kwargs or {}))

    def entry() -> float:
        with Empty():
            return _us(lambda: a + b, n)

    def allocator() -> float:
        alloc = CachingAllocator()
        held = [alloc.allocate(256) for _ in range(8)]  # a pool with a few blocks in use

        def pair() -> None:
            alloc.free(alloc.allocate(256))
        t = _us(pair, n)
        del held
        return t

    def marking() -> float:
        # mark_one on a fresh storage and the mark's death (its weakref callback), with the
        # GPU's allocator replaced by one that hands out one block: the marking alone.
        stop = _simulating(None, True)
        try:
            from devlab.engine.simulated.base import session as sess_mod
            alloc = sess_mod.session.devices[0].allocator
            block = alloc.allocate(256)
            alloc.allocate = lambda size, stream=0: block
            alloc.free = lambda blk: None
            try:
                with _no_mode():
                    def mark_and_drop() -> None:
                        marks.mark_one(torch.empty(64).untyped_storage(), 0)
                    t_mark = _us(mark_and_drop, n)
                    t_bare = _us(lambda: torch.empty(64).untyped_storage(), n)
            finally:
                del alloc.allocate, alloc.free
                alloc.free(block)
            return t_mark - t_bare
        finally:
            stop()

    def clock() -> float:
        stop = _simulating("T4", True)
        try:
            from devlab.engine.simulated.base import session as sess_mod
            charges = sess_mod.session.charges
            x = torch.randn(8, 8, device="cuda:0")
            y = torch.randn(8, 8, device="cuda:0")
            out = x + y
            with _no_mode():
                def charge() -> None:
                    charges.enter()
                    charges.call(Tensor_add, (x, y), {}, out, 0, True)
                    charges.leave()
                    charges.enter()
                    charges.leave()
                return _us(charge, n)
        finally:
            stop()

    def total(model: str | None) -> float:
        stop = _simulating(model, True)
        try:
            x = torch.randn(8, 8, device="cuda:0")
            y = torch.randn(8, 8, device="cuda:0")
            return _us(lambda: x + y, n)
        finally:
            stop()

    per: dict[str, list[float]] = {}
    for _ in range(rounds):
        got = {"bare op": _us(lambda: a + b, n), "empty mode": entry(),
               "allocator": allocator(), "marking": marking(), "clock": clock(),
               "simulated": total(None), "T4": total("T4")}
        for k, v in got.items():
            per.setdefault(k, []).append(v)
    m = {k: statistics.median(v) for k, v in per.items()}
    entry_cost = m["empty mode"] - m["bare op"]
    out = {}
    for label, clock_cost in (("simulated", 0.0), ("T4", m["clock"])):
        overhead = m[label] - m["bare op"]
        out[label] = {"op (the CPU's)": m["bare op"], "mode entry": entry_cost,
                      "routing": overhead - entry_cost - m["marking"] - m["allocator"]
                      - clock_cost,
                      "marking": m["marking"], "allocator": m["allocator"], "clock": clock_cost,
                      "total": m[label]}
    return out


# Where each function's own time goes, by the file (and for storage_marks, the function) it
# is in: the layers of docs/op-cost.md. A builtin's time goes to its caller's layer.
_LAYER_OF_FILE = (
    ("caching_allocator", "allocator"), ("clock/", "clock"), ("placement_log", "log"),
    ("storage_marks.py:tensors_of", "routing"), ("storage_marks", "marking"),
    ("session.py:current_stream", "marking"), ("session.py", "clock"),
    ("routing.py", "routing"), ("device_rule.py", "routing"), ("factories.py", "routing"),
    ("device_args.py", "routing"), ("gpu_workers.py", "routing"), ("async_launch.py", "routing"),
    ("dispatch_devices.py", "routing"), ("simulated/", "routing"),
)


def _layer(func: tuple) -> str | None:
    where = f"{func[0]}:{func[2]}"
    for part, layer in _LAYER_OF_FILE:
        if part in where:
            return layer
    return None


def profile(case: str, mode: str) -> dict[str, float]:
    """cProfile's own time of one case by layer, as fractions of the profiled total: the
    op's builtin (torch's kernel and C++ override check: `op and entry`), and the layers'
    Python. cProfile adds a cost per call, so calls weigh more than they cost; the fractions
    say where the calls are, callgrind's totals and the wall time how much they cost."""
    import cProfile
    import pstats

    torch.set_num_threads(1)
    simulated.start(1, model=None if mode == "simulated" else mode)
    try:
        fn, n = _case(case, "cuda:0")
        for _ in range(n // 10 + 1):
            fn()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            fn()
        prof.disable()
    finally:
        simulated.stop()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    by: dict[str, float] = {}
    for func, (_, _, tottime, _, callers) in stats.items():
        layer = _layer(func)
        if layer is None and callers:  # a builtin, or the benchmark's own loop
            top = max(callers, key=lambda c: callers[c][2])
            layer = _layer(top)
            if layer == "routing" and func[2].startswith("<method") and "TensorBase" in func[2]:
                layer = "op and entry"  # the op itself, called from the mode
        by[layer or "op and entry"] = by.get(layer or "op and entry", 0.0) + tottime
    total = sum(by.values())
    return {k: v / total for k, v in sorted(by.items(), key=lambda kv: -kv[1])}


Tensor_add = torch.Tensor.add


class _no_mode:
    """No simulation mode on this thread's stack for the block (a layer timed alone)."""

    def __enter__(self) -> None:
        from devlab.engine.simulated.mode import routing
        self._ctx = routing.suspended()
        self._ctx.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)


if __name__ == "__main__":
    main()
