"""devlab's pytest plugin, as pytest loads it (the `pytest11` entry point `devlab`): the options,
the marker, and nothing else unless asked.

`pytest --simulate-gpus N` (with `--gpu-model`, `--gpu-memory`, `--gpu-topology`,
`--gpu-leaks`), or `DEVLAB_SIMULATE_GPUS=N` in the environment, asks for simulated GPUs; then
`devlab.fronts.pytest_plugin` starts them before conftest files and test modules are imported and
joins pytest. Unasked, pytest pays for adding five options and one marker: this module sits
outside the `devlab` package because importing `devlab` imports torch (as
`_devlab_autostart.py` does for the start-up hook), and imports neither.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import pytest

VARIABLE = "DEVLAB_SIMULATE_GPUS"
MARKER = ("simulated_gpus(n=1, model=None, memory=None): the test needs n simulated GPUs (skipped "
          "with fewer), or runs on GPUs of that model / memory per GPU (devlab, with "
          "--simulate-gpus)")
_GPU_OPTIONS = ("gpu_model", "gpu_memory", "gpu_topology")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("devlab", "devlab's simulated GPUs (CUDA tests on a CPU-only machine)")
    group.addoption("--simulate-gpus", metavar="N", default=None, dest="simulate_gpus",
                    help="run the tests on N simulated CUDA GPUs: torch.cuda.is_available() is "
                         "True here, in xdist workers and in every process the tests start "
                         "(default: $DEVLAB_SIMULATE_GPUS)")
    group.addoption("--gpu-model", metavar="NAME", default=None, dest="gpu_model",
                    help="the GPU they model: its memory, compute capability and modeled clock "
                         "(T4, L4, A100, H100, ...; default: $DEVLAB_SIMULATE_GPU_MODEL, else "
                         "none)")
    group.addoption("--gpu-memory", metavar="SIZE", default=None, dest="gpu_memory",
                    help="memory per simulated GPU, such as 1GiB or 512MiB: allocations past it "
                         "raise torch.OutOfMemoryError (default: the model's, else the host's)")
    group.addoption("--gpu-topology", metavar="NAME", default=None, dest="gpu_topology",
                    help="the machine the modeled GPUs' collectives are timed in "
                         "(pcie3-p2p, nvswitch-a100, ...; needs --gpu-model)")
    group.addoption("--gpu-leaks", metavar="WHAT", default=None, dest="gpu_leaks",
                    help="memory a passing test leaves allocated on a simulated GPU: 'report' "
                         "(default) lists it in the summary, 'fail' makes it an error, 'off'")


def _asked(namespace: object) -> bool:
    if getattr(namespace, "simulate_gpus", None) is not None:
        return True
    return os.environ.get(VARIABLE, "").strip() not in ("", "0")


def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser,
                                  args: list[str]) -> None:
    """Start the simulated GPUs before the first conftest is imported (one that asks
    `torch.cuda.is_available()` at import must get True)."""
    ns = early_config.known_args_namespace
    if _asked(ns):
        from devlab.fronts import pytest_plugin

        pytest_plugin.start(early_config, ns)
    else:
        given = [o for o in _GPU_OPTIONS + ("gpu_leaks",) if getattr(ns, o, None) is not None]
        if given:
            import pytest

            flag = "--" + given[0].replace("_", "-")
            raise pytest.UsageError(
                f"{flag} applies to simulated GPUs: add --simulate-gpus N (or set "
                f"{VARIABLE}=N), e.g. pytest --simulate-gpus 2 {flag} ...")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    if _asked(config.option):
        from devlab.fronts import pytest_plugin

        pytest_plugin.join(config)
