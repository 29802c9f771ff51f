"""Fuzzing the magics' argument lines, in an in-process IPython shell with devlab's extension
loaded (its cell hooks included): every line either works or is a one-line UsageError, and a
refused line leaves nothing switched on (no log mode, no sampler thread, no setting, no default
device, no --file that errors under the next cell). `%%distributed` is fuzzed with its own
tests (tests/test_distributed*.py)."""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from devlab.core import config, debugging
from devlab.core import placement_scope as scope
from devlab.core.placement_log import DEFAULT_LIMIT
from devlab.engine import simulated
from devlab.fronts.lab.magics import _state, load_ipython_extension, unload_ipython_extension

FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- what a line is made of ---------------------------------------------------------------------

NAMES = st.sampled_from([
    "/GPU:0", "/GPU:1", "/CPU:0", "cpu", "cuda:0", "gpu", "/device:GPU:1", "/GPU:7", "/foo:1",
    "/GPU:-1", "/GPU:٣", "''", '""', "/CPU:1", "cuda:x", "/job:worker/GPU:0", "/GPU:" + "9" * 50,
])
INTS = st.sampled_from(["0", "1", "3", "-1", "-3", "1.5", "x", "1e3", "99999999999999999999",
                        "nan", "''"])
FLOATS = st.sampled_from(["0", "0.5", "1", "50", "-5", "inf", "-inf", "nan", "1e300", "x", "1e-9"])
JUNK = st.one_of(
    st.text(st.characters(codec="ascii", exclude_categories=["Cc"]), max_size=12),
    st.sampled_from(["--bogus", "-x", "--", "#", "# a comment", "'unclosed", '"unclosed', "=",
                     "--limit=-2", "--interval=inf", "--file", "\\"]),
)


def line_of(*parts: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.lists(st.one_of(*parts, JUNK), max_size=5).map(" ".join)


def opt(flag: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return values.map(lambda v: f"{flag} {v}")


FILES = st.sampled_from(["{tmp}/log.txt", "'{tmp}/with space.log'", "/nonexistent/x.log",
                         "{tmp}", "''", "{tmp}/log#1.txt", "/proc/version/x"])

DEVICE_LINE = line_of(NAMES, st.just("--soft"), st.just("--log"), st.just("--reset"),
                      opt("--limit", INTS))
PLACEMENT_LINE = line_of(st.sampled_from(["on", "off", "maybe"]), opt("--limit", INTS),
                         opt("--file", FILES))
DEVICES_LINE = line_of(opt("--simulate-gpus", st.sampled_from(["0", "1", "2", "-1", "x", "1.5"])),
                       opt("--memory-limit", st.sampled_from(["64", "0", "-5", str(2**70), "x"])),
                       opt("--model", st.sampled_from(["T4", "A100", "foo", "''"])))
MEMWATCH_LINE = line_of(opt("--device", NAMES), opt("-d", NAMES), opt("--interval", FLOATS),
                        opt("-i", FLOATS))
# Quick timing first (a drawn option repeats it, and the last one counts); values a timing cannot
# finish (--min-time inf, --repeats 10**9) must be refused before anything runs.
COMPARE_LINE = st.tuples(
    st.lists(NAMES, min_size=0, max_size=3).map(" ".join),
    line_of(opt("--setup", st.sampled_from(['"x = torch.ones(3)"', "'x = ('", '"x = 1  # c"',
                                            "x=1"])),
            opt("--warmup", st.sampled_from(["0", "1", "-2", "x", str(10**9)])),
            opt("--repeats", st.sampled_from(["1", "0", "-1", "x", str(10**9)])),
            opt("--min-time", st.sampled_from(["0", "0.001", "-1", "nan", "x", "inf", "1e300"])),
            st.just("--output"), st.just("-o")),
).map(lambda t: f"{t[0]} --min-time 0 --warmup 0 --repeats 1 {t[1]}")


# -- the shell and what "nothing switched on" means ---------------------------------------------

@pytest.fixture(scope="module")
def ip(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    shell.user_ns["torch"] = torch
    shell.user_ns["_fuzz_tmp"] = str(tmp_path_factory.mktemp("fuzz"))
    unload_ipython_extension(shell)
    with contextlib.redirect_stdout(io.StringIO()):
        load_ipython_extension(shell)
    yield shell
    unload_ipython_extension(shell)


def state(shell: InteractiveShell) -> tuple[Any, ...]:
    placement = _state["placement"]
    return (
        debugging.get_log_device_placement(),
        torch.get_default_device(),
        scope.current_default(),
        torch._C._len_torch_function_stack(),
        torch._C._len_torch_dispatch_stack(),
        simulated.is_active() and simulated.device_count(),
        repr(config._settings),
        placement.file,
        placement.limit,
        sorted(t.name for t in threading.enumerate() if t.name.startswith("devlab")),
        [len(shell.events.callbacks[e]) for e in ("pre_run_cell", "post_run_cell")],
    )


def run(shell: InteractiveShell, source: str) -> tuple[Any, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        result = shell.run_cell(source, store_history=False)
    return result, out.getvalue()


def fresh(shell: InteractiveShell) -> None:
    """Every example starts from the same session: two simulated GPUs, nothing switched on."""
    debugging.reset()
    scope.reset_default()
    config.reset()
    placement = _state["placement"]
    placement.file, placement.limit = None, DEFAULT_LIMIT
    config.simulate_gpus(2)


def check(shell: InteractiveShell, source: str) -> None:
    source = source.replace("{tmp}", shell.user_ns["_fuzz_tmp"])
    fresh(shell)
    before = state(shell)
    result, shown = run(shell, source)
    err = result.error_in_exec or result.error_before_exec
    if err is not None:
        assert isinstance(err, UsageError), f"{source!r} raised {type(err).__name__}: {err}"
        assert str(err).strip() and "\n" not in str(err).strip(), f"{source!r}: {err!r}"
        assert "Traceback" not in shown, shown
        assert state(shell) == before, f"{source!r} was refused but left something changed"
    # Whatever it did, the next cell runs clean: no hook that errors, no thread left.
    after, shown = run(shell, "_fuzz_next = 1 + 1")
    assert after.success and "Error in callback" not in shown, f"after {source!r}:\n{shown}"
    assert not [t for t in threading.enumerate() if t.name == "devlab-memory-sampler"]
    assert torch._C._len_torch_dispatch_stack() == before[4]
    fresh(shell)


# -- the fuzz tests ----------------------------------------------------------------------------

@FUZZ
@given(DEVICE_LINE, st.booleans())
def test_fuzz_device(ip: InteractiveShell, line: str, as_cell: bool) -> None:
    check(ip, f"%%device {line}\n_y = torch.ones(2)" if as_cell else f"%device {line}")


@FUZZ
@given(PLACEMENT_LINE, st.booleans())
def test_fuzz_placement_log(ip: InteractiveShell, line: str, as_cell: bool) -> None:
    check(ip, f"%%placement_log {line}\n_y = torch.ones(2) + 1" if as_cell
          else f"%placement_log {line}")


@FUZZ
@given(DEVICES_LINE)
def test_fuzz_devices(ip: InteractiveShell, line: str) -> None:
    check(ip, f"%devices {line}")


@settings(FUZZ, max_examples=25)
@given(MEMWATCH_LINE)
def test_fuzz_memwatch(ip: InteractiveShell, line: str) -> None:
    check(ip, f"%%memwatch {line}\n_y = torch.ones(1000)")


@settings(FUZZ, max_examples=25)
@given(COMPARE_LINE)
def test_fuzz_compare_devices(ip: InteractiveShell, line: str) -> None:
    check(ip, f"%%compare_devices {line}\n_y = torch.ones(8) * 2")


# -- the cases the fuzz found, and the issue's, as lines a user types --------------------------

def test_issue_16_placement_log_file_in_a_missing_folder(ip: InteractiveShell) -> None:
    # As the issue wrote it: `%placement_log on --file /nonexistent/x.log` was accepted, then
    # every later cell printed "Error in callback … post_run_cell", even after
    # `%placement_log off`.
    fresh(ip)
    before = state(ip)
    result, shown = run(ip, "%placement_log on --file /nonexistent/x.log")
    assert isinstance(result.error_in_exec, UsageError)
    assert "UsageError: Cannot write the placement log to '/nonexistent/x.log': the folder " \
           "'/nonexistent' does not exist." in shown
    assert state(ip) == before  # the log is still off
    for source in ("1 + 1", "%placement_log off", "2 + 2"):
        result, shown = run(ip, source)
        assert result.success and "Error in callback" not in shown, shown


def test_a_log_file_that_stops_being_writable_is_said_once(ip: InteractiveShell, tmp_path) -> None:
    fresh(ip)
    folder = tmp_path / "logs"
    folder.mkdir()
    run(ip, f"%placement_log on --file {folder}/p.log")
    run(ip, "_a = torch.ones(2) + 1")
    assert "aten::add" in (folder / "p.log").read_text()
    (folder / "p.log").unlink()
    folder.rmdir()
    _, first = run(ip, "_a = torch.ones(2) + 1")
    _, second = run(ip, "_a = torch.ones(2) + 1")
    assert "devlab: could not append the placement log to" in first
    assert "Error in callback" not in first + second and "could not append" not in second
    fresh(ip)


@pytest.mark.parametrize("source, expected", [
    ("%device /GPU:1  # the second GPU", "Default device: /job:localhost/replica:0/task:0/device:GPU:1"),
    ("%placement_log  # is it on?", "Placement log is off."),
    ("%devices # all of them", "/device:GPU:1"),
])
def test_a_trailing_comment_on_a_magic_line_is_a_comment(ip, source, expected) -> None:
    fresh(ip)
    result, shown = run(ip, source)
    assert result.success and expected in shown, shown
    fresh(ip)


def test_a_hash_inside_a_word_or_quotes_is_kept(ip, tmp_path) -> None:
    fresh(ip)
    result, _ = run(ip, f"%placement_log on --file {tmp_path}/log#1.txt  # keep every line")
    assert result.success and _state["placement"].file == tmp_path / "log#1.txt"
    fresh(ip)
    result, _ = run(ip, '%%compare_devices cpu --min-time 0 --repeats 1 --setup "x = 1  # one" -o\n'
                        "x + 1")
    assert result.success and result.result.results[0].name == "cpu"


@pytest.mark.parametrize("source, message", [
    ("%device /GPU:0 --log", "--log is for the cell form %%device only."),
    ("%device --limit 3", "--limit is for the cell form %%device only."),
    ("%%device /GPU:0 --reset\npass", "--reset is for the line form %device only."),
    ("%%device /GPU:0 --limit 3\npass", "--limit is the number of log lines to show: it goes with --log."),
    ("%device /GPU:0 --reset", "%device --reset goes back to the default device before; give it no name."),
    ("%%device /GPU:0 --log --limit -1\npass", "--limit is the number of lines to show, 0 or more; got -1."),
    ("%devices --memory-limit 64", "--memory-limit goes with --simulate-gpus N."),
    ('%%memwatch --device "/GPU:0\npass', "No closing quotation in the magic's line"),
])
def test_options_that_would_do_nothing_are_refused(ip, source, message) -> None:
    fresh(ip)
    before = state(ip)
    result, shown = run(ip, source)
    assert isinstance(result.error_in_exec, UsageError), shown
    assert message in str(result.error_in_exec), str(result.error_in_exec)
    assert state(ip) == before
    fresh(ip)


def test_issue_16_reload_ext_keeps_the_simulation(ip: InteractiveShell) -> None:
    # As the issue wrote it: `%reload_ext devlab` silently stopped the simulation (a tensor
    # made on cuda:1 then said `cpu`); `%unload_ext devlab` still returns torch to normal.
    fresh(ip)
    ip.extension_manager.loaded.add("devlab")  # as %load_ext devlab records it
    run(ip, "_t = torch.ones(3, device='cuda:1')")
    result, shown = run(ip, "%reload_ext devlab")
    assert result.success and "devlab reloaded: devices /CPU:0, /GPU:0, /GPU:1." in shown, shown
    result, shown = run(ip, "print(_t.device, torch.cuda.device_count())")
    assert shown.strip() == "cuda:1 2"
    result, shown = run(ip, "%unload_ext devlab")
    assert result.success and not simulated.is_active()
    assert str(ip.user_ns["_t"].device) == "cpu" and not torch.cuda.is_available()
    with contextlib.redirect_stdout(io.StringIO()):
        load_ipython_extension(ip)  # the module's shell, as it was


def test_loading_again_after_unloading_brings_back_the_environments_gpus(
        ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    # On Binder DEVLAB_SIMULATE_GPUS=2 is set for every kernel: `%unload_ext devlab` returns
    # torch to normal, and `%load_ext devlab` again gives what a new kernel has.
    monkeypatch.setenv("DEVLAB_SIMULATE_GPUS", "2")
    fresh(ip)
    unload_ipython_extension(ip)
    assert not simulated.is_active()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        load_ipython_extension(ip)
    assert simulated.device_count() == 2
    assert "devlab loaded: devices /CPU:0, /GPU:0, /GPU:1." in out.getvalue(), out.getvalue()
    monkeypatch.delenv("DEVLAB_SIMULATE_GPUS")
    fresh(ip)
