"""Fuzzed, as issue 16 asks: `devlab.launch` survives any sequence of functions (returns,
unpicklable values and exceptions, sys.exit, os._exit, signals), with and without simulated
GPUs; `%%distributed`'s argument line either runs the cell or is a one-line UsageError. After
every example nothing is left: no child, no listener, no descriptor, the same SIGINT handler.
Bounded: a few launches per example, forked ranks (a spawned rank imports torch afresh)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import devlab
from devlab.core import ranks as distributed
from devlab.fronts.lab.magics.rank_magics import DistributedMagics

sys.path.insert(0, str(Path(__file__).resolve().parent / "distributed"))
import hygiene  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_simulation")

LOCK = threading.Lock()


class Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("carries a lock")
        self.lock = threading.Lock()


def returns_42() -> int:
    return 42


def touches_a_lock() -> int:
    with LOCK:
        return 1


def returns_a_lock() -> threading.Lock:
    return LOCK


def raises_unpicklable() -> None:
    raise Unpicklable()


def raises_value_error() -> None:
    raise ValueError("plain")


def exits(code: int) -> None:
    sys.exit(code)


def exits_at_once(code: int) -> None:
    os._exit(code)


def killed_by(sig: int) -> None:
    os.kill(os.getpid(), sig)


def all_reduces() -> float:
    dist.init_process_group("gloo")
    t = torch.ones(2)
    dist.all_reduce(t)
    return t.sum().item()


def on_gpu() -> str:
    return str(torch.ones(1, device=int(os.environ["RANK"]) % max(1, torch.cuda.device_count())
                          if torch.cuda.is_available() else "cpu").device)


# Each entry: the function, its arguments, and what the launch must give on n ranks.
CATALOGUE = {
    "42": (returns_42, (), lambda n, out: out == [42] * n),
    "lock": (touches_a_lock, (), lambda n, out: out == [1] * n),
    "returns lock": (returns_a_lock, (), lambda n, out: isinstance(out, distributed.RankError)
                     and "cannot be pickled to send it back" in str(out)),
    "unpicklable": (raises_unpicklable, (), lambda n, out: isinstance(out, distributed.RankError)
                    and str(out).endswith("Unpicklable: carries a lock")),
    "ValueError": (raises_value_error, (), lambda n, out: isinstance(out, ValueError)),
    "sys.exit(5)": (exits, (5,), lambda n, out: isinstance(out, SystemExit) and out.code == 5),
    "sys.exit(0)": (exits, (0,), lambda n, out: out == [None] * n),
    "os._exit(7)": (exits_at_once, (7,), lambda n, out: isinstance(out, distributed.RankError)
                    and "exit code 7" in str(out)),
    "SIGKILL": (killed_by, (signal.SIGKILL,), lambda n, out: isinstance(out, distributed.RankError)
                and "SIGKILL" in str(out)),
    "all_reduce": (all_reduces, (), lambda n, out: out == [2.0 * n] * n),
    "device": (on_gpu, (), lambda n, out: isinstance(out, list) and len(out) == n),
}


def _untouched() -> tuple[object, ...]:
    """What a launch could leave: IPython's history thread and its database (which IPython
    starts and ends as it likes) left out."""
    state = hygiene.state()
    return (state["children"], state["listeners"],
            [d for d in state["descriptors"] if not d[1].endswith("history.sqlite")],
            [t for t in state["threads"] if t != "IPythonHistorySavingThread"],
            signal.getsignal(signal.SIGINT))


def _sequence(names: list[str], nprocs: int) -> None:
    for name in names:
        fn, args, expected = CATALOGUE[name]
        try:
            out = devlab.launch(fn, *args, nprocs=nprocs, timeout=120)
        except BaseException as e:  # noqa: BLE001 - every ending is checked below
            out = e
        assert expected(nprocs, out), (name, nprocs, out)


sequences = st.lists(st.sampled_from(sorted(CATALOGUE)), min_size=1, max_size=4)


@pytest.fixture(scope="module", autouse=True)
def warmed_up():
    devlab.launch(all_reduces)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=sequences, nprocs=st.integers(1, 3))
def test_any_sequence_of_functions_on_the_cpu(names: list[str], nprocs: int) -> None:
    before = _untouched()
    _sequence(names, nprocs)
    assert _untouched() == before


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=sequences, nprocs=st.integers(1, 3))
def test_any_sequence_of_functions_on_simulated_gpus(names: list[str], nprocs: int) -> None:
    devlab.simulated.start(2)
    try:
        before = _untouched()
        _sequence(names, nprocs)
        assert _untouched() == before
    finally:
        devlab.simulated.stop()


# --- %%distributed's argument line -------------------------------------------------------------

@pytest.fixture(scope="module")
def ip():
    shell = InteractiveShell.instance()
    shell.register_magics(DistributedMagics(shell))
    shell.run_cell_magic("distributed", "", CELL)  # what the first cell loads once
    return shell


EXPORT_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / f"devlab-fuzz-{os.getpid()}"
TOKENS = [
    "-n", "--nprocs", "1", "2", "3", "0", "-1", "abc", "10000", "2.5", "1e3", "0x2",
    "99999999999999999999", "٣", "--timeout", "60", "0", "-5", "nan", "inf", "-inf", "1e400",
    "1e9", "--log", "--limit", "5", "--start-method", "fork", "forkserver", "thread", "FORK",
    "--export", str(EXPORT_DIR / "cell.py"), "/nonexistent/folder/cell.py", str(EXPORT_DIR),
    "cell.txt", "''", '"', "'", "--", "-x", "--nprocs=2", "-n2", "%", "\\", "--help", "-h",
]
lines = st.one_of(
    st.lists(st.sampled_from(TOKENS), max_size=6).map(" ".join),
    st.text(max_size=20),
)
CELL = "import os\nint(os.environ['RANK'])"


def _ranks_asked(line: str) -> int:
    """How many ranks a line that ran asked for (argparse: the last -n wins)."""
    import shlex

    words = shlex.split(line)
    n = 2
    for i, word in enumerate(words):
        if word in ("-n", "--nprocs") and i + 1 < len(words):
            n = int(words[i + 1])
        elif word.startswith("--nprocs="):
            n = int(word.split("=", 1)[1])
        elif word.startswith("-n") and word[2:].lstrip("-").isdigit():
            n = int(word[2:])
    return n


@settings(max_examples=80, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(line=lines)
def test_every_argument_line_runs_or_is_a_one_line_usage_error(ip, line: str) -> None:
    EXPORT_DIR.mkdir(exist_ok=True)
    before = _untouched()
    try:
        out = ip.run_cell_magic("distributed", line, CELL)
    except UsageError as e:
        assert str(e) and "\n" not in str(e), repr(str(e))
    except TimeoutError:  # a tiny --timeout that ran out is the cell running
        assert "--timeout" in line
    else:
        if isinstance(out, distributed.Export):
            assert out.path.read_text().rstrip().endswith(CELL)
        else:
            assert out == list(range(_ranks_asked(line))), (line, out)
    assert _untouched() == before
    for written in EXPORT_DIR.glob("*"):
        written.unlink()


def teardown_module() -> None:
    if EXPORT_DIR.exists():
        for written in EXPORT_DIR.glob("*"):
            written.unlink()
        EXPORT_DIR.rmdir()
