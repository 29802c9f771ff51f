"""devlab's pytest plugin: a library's CUDA tests run on simulated GPUs on a CPU-only machine.

`pytest --simulate-gpus 2 [--gpu-model A100] [--gpu-memory 1GiB] [--gpu-topology NAME]`, or
`DEVLAB_SIMULATE_GPUS=2 pytest`: tests gated on `torch.cuda.is_available()` run unmodified,
here, in pytest-xdist workers, and in every process they start (the DEVLAB_* variables are set
for the start-up hook: torchrun, mp.spawn, a subprocess `python`). pytest loads the options
from `_devlab_pytest` (outside this package, so an unasked pytest imports no torch); this
package is the rest, a thin front over `devlab.config` and `devlab.simulated`:

- the header names the simulated GPUs and what they cannot check; the summary counts the
  tests that made a tensor on one, and lists the memory passing tests left allocated;
- each test starts afresh (`devlab.simulated.fresh_start`: no cached memory, peak statistics
  reset, device 0 on its default streams, torch's default device as the session began);
- `@pytest.mark.simulated_gpus(n, model=, memory=)` skips a test that needs more GPUs than are
  simulated, and runs one on GPUs of another model or memory (the `simulated_gpus` fixture
  tells a test what it runs on);
- the simulation's findings (a non_blocking copy read before it was waited for, a tensor freed
  while another stream uses it, or while another stream's copy to the host still reads it:
  `devlab.engine.simulated.base.hazards`) fail the test that made them, naming the line that
  queued the work and the line that came too early.
"""

from __future__ import annotations

import gc
import os
from typing import Any

import pytest

from devlab.fronts.pytest_plugin import options as _options
from devlab.fronts.pytest_plugin import report as _report
from devlab.fronts.pytest_plugin.options import OptionError, Settings

__all__ = ["SimulatedGpus", "Settings", "join", "start"]

_SETTINGS = pytest.StashKey[Settings]()
_ITEM = pytest.StashKey[dict]()
PLUGIN_NAME = "devlab-simulated-gpus"


def visible(settings: Settings) -> int:
    """How many of the simulated machine's GPUs this process sees: `CUDA_VISIBLE_DEVICES`
    hides some here as it would on a real machine (and as the start-up hook does in every
    process the tests start, from the machine's count in `DEVLAB_SIMULATE_GPUS`)."""
    from devlab.core import config

    return config.cuda_visible_count(settings.count)


def _simulate(settings: Settings) -> None:
    """Environment first (the processes tests start: the machine's count), then this
    process's GPUs (those `CUDA_VISIBLE_DEVICES` shows it; none: torch sees no GPU)."""
    os.environ.update(settings.environment())
    from devlab.core import config

    count = visible(settings)
    if count == 0:
        return
    try:
        config.simulate_gpus(count, memory_limit=settings.memory_mb,
                             model=settings.model, topology=settings.topology)
    except (RuntimeError, ValueError) as e:
        raise pytest.UsageError(f"devlab could not simulate GPUs: {e}") from None


def start(config: pytest.Config, namespace: Any) -> Settings:
    """Start the GPUs the options (else the environment) ask for, before any conftest."""
    got = config.stash.get(_SETTINGS, None)
    if got is not None:
        return got
    try:
        settings = _options.settings(namespace)
    except OptionError as e:
        raise pytest.UsageError(str(e)) from None
    _simulate(settings)
    config.stash[_SETTINGS] = settings
    return settings


def join(config: pytest.Config) -> None:
    """pytest_configure: the GPUs run (started now if the early hook did not), the hooks join."""
    settings = start(config, config.option)
    if not config.pluginmanager.has_plugin(PLUGIN_NAME):
        config.pluginmanager.register(SimulatedGpus(config, settings), PLUGIN_NAME)


class GpuView:
    """What the `simulated_gpus` fixture gives a test: the GPUs it runs on, and the findings
    the simulation made so far in it (`take_findings()` takes them, so a test that makes one
    on purpose can assert on it and still pass)."""

    def __init__(self, settings: Settings, findings: list) -> None:
        self.settings = settings
        self.count = settings.count
        self.model = settings.model
        self.memory_mb = settings.memory_mb
        self.findings = findings

    def take_findings(self) -> list:
        got = list(self.findings)
        self.findings.clear()
        return got

    def __repr__(self) -> str:
        return f"<simulated_gpus: {_report.describe(self.settings)}>"


class SimulatedGpus:
    """The plugin's hooks, registered once simulated GPUs run."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        import torch

        from devlab.engine import simulated

        self.config = config
        self.settings = settings
        self.current = settings  # what runs now (a marker may change it for one test)
        self.ran = 0
        self.total = 0
        self.leaks: list[tuple[str, list[int]]] = []
        self.findings: list = []  # the running test's
        self._default_device = torch.get_default_device()
        self._device_context = _default_device_context()
        self._stop_listening = simulated.listen_findings(self.findings.append)
        import _pytest
        import pluggy

        simulated.base.hazards.skip_frames_of(os.path.dirname(_pytest.__file__),
                                              os.path.dirname(pluggy.__file__),
                                              os.path.dirname(pytest.__file__))

    # -- the header and the summary --------------------------------------------------------

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return _report.header(self.settings, visible(self.settings))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        self.total += 1
        seen = getattr(report, "devlab_gpus", None) or {}
        if seen.get("touched"):
            self.ran += 1
        if seen.get("leaked"):
            self.leaks.append((report.nodeid, seen["leaked"]))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.write_sep("-", "devlab: simulated GPUs")
        for line in _report.summary(self.ran, self.total, self.leaks, self.settings.leaks):
            terminalreporter.write_line(line)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._stop_listening()

    # -- each test --------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        state: dict[str, Any] = {}
        item.stash[_ITEM] = state
        marker = item.get_closest_marker("simulated_gpus")
        if marker is not None:
            try:
                need, wanted = _options.marker_settings(self.settings, marker.args,
                                                        marker.kwargs)
            except OptionError as e:  # this test's mistake: it fails, the others run
                pytest.fail(str(e), pytrace=False)
            seen = visible(self.settings)
            if need > seen:
                shown = ("" if seen == self.settings.count else
                         f", {seen} visible (CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
                raise pytest.skip.Exception(  # reported at the test, as a skip mark is
                    f"needs {need} simulated GPUs; {self.settings.count} simulated{shown} "
                    f"(pytest --simulate-gpus {need} runs it)", _use_item_location=True)
            if wanted != self.current:
                self._switch(wanted)
        self._fresh()

    def _fresh(self) -> None:
        import torch

        from devlab.engine import simulated

        self.findings.clear()
        # torch.set_default_device replaces this context: while it is the session's, so is
        # the default device (and torch.get_default_device() costs more than the rest).
        if _default_device_context() is not self._device_context:
            if torch.get_default_device() != self._default_device:
                torch.set_default_device(self._default_device)
            self._device_context = _default_device_context()
        if simulated.is_active():  # CUDA_VISIBLE_DEVICES may hide every GPU from this process
            simulated.fresh_start()

    def _switch(self, settings: Settings) -> None:
        """Run on other GPUs (a marker's model or memory): a new simulation, as a new
        process would start it, with the environment to match."""
        from devlab.core import config

        config.stop_simulation()
        _simulate(settings)
        self.current = settings

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        from devlab.engine import simulated

        state = item.stash.get(_ITEM, {})
        state["before"] = _allocated(simulated) if simulated.is_active() else None
        state["allocations"] = simulated.allocations()
        try:
            result = yield
        finally:  # the test itself made a tensor on a simulated GPU (or was refused one)
            state["touched"] = (simulated.is_active()
                                and simulated.allocations() != state["allocations"])
        self._fail_on_findings("")
        return result

    def _fail_on_findings(self, when: str) -> None:
        if not self.findings:
            return
        found = list(self.findings)
        self.findings.clear()
        text = "\n\n".join(str(f) for f in found)
        pytest.fail(f"devlab: the simulated GPUs found {len(found)} synchronization "
                    f"bug{'s' if len(found) != 1 else ''}{when} (a real GPU gets these wrong "
                    f"now and then):\n\n{text}", pytrace=False)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: Any) -> Any:
        from devlab.engine import simulated

        result = yield
        state = item.stash.get(_ITEM, {})
        if simulated.is_active():
            before = state.get("before")
            if before is not None and state.get("passed") and self.settings.leaks != "off":
                after = _allocated(simulated)
                if any(a > b for a, b in zip(after, before, strict=False)):
                    gc.collect()  # a cycle (a module and its optimizer) goes only with it
                    after = _allocated(simulated)
                leaked = [max(0, a - b) for a, b in zip(after, before, strict=False)]
                if any(leaked):
                    state["leaked"] = leaked
        if self.current != self.settings:
            self._switch(self.settings)
        self._fail_on_findings(" in teardown")
        if state.get("leaked") and self.settings.leaks == "fail":
            from devlab._helpers.sizes import format_bytes

            where = ", ".join(f"{format_bytes(b)} on cuda:{i}"
                              for i, b in enumerate(state["leaked"]) if b)
            pytest.fail(f"devlab: the test left {where} allocated on simulated GPUs after it "
                        "ended (--gpu-leaks=fail): a tensor still referenced from a global, a "
                        "cache or a fixture", pytrace=False)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Any:
        rep = yield
        state = item.stash.get(_ITEM, None)
        if state is not None:
            if rep.when == "call":
                state["passed"] = rep.passed
            elif rep.when == "teardown":
                rep.devlab_gpus = {"touched": bool(state.get("touched")),
                                   "leaked": state.get("leaked")}
        return rep

    @pytest.fixture
    def simulated_gpus(self) -> GpuView:
        """The simulated GPUs this test runs on, and the findings it made so far."""
        return GpuView(self.current, self.findings)


def _default_device_context() -> Any:
    import torch

    return getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)


def _allocated(simulated: Any) -> list[int]:
    return simulated.leftover()
