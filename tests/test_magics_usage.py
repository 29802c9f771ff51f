"""Mistakes in a magic's own arguments are one-line UsageErrors, in both magic classes (no kernel)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from devlab.fronts.lab.magics.monitoring_magics import MonitoringMagics
from devlab.fronts.lab.magics.placement_magics import PlacementMagics
from devlab.fronts.lab.magics.usage import usage_errors


@pytest.fixture(scope="module")
def ip():
    shell = InteractiveShell.instance()
    shell.register_magics(PlacementMagics(shell), MonitoringMagics(shell))
    return shell


def test_devlab_mistakes_become_their_first_line_and_faults_keep_their_type() -> None:
    with pytest.raises(UsageError) as err:
        with usage_errors():
            raise ValueError("what was wrong; what would be right\ndetail")
    assert str(err.value) == "what was wrong; what would be right"
    with pytest.raises(KeyError):
        with usage_errors():
            raise KeyError("a fault in devlab, not in the arguments")


@pytest.mark.parametrize("magic, line, message", [
    ("device", "/foo:1", "Unknown attribute 'foo' is encountered while parsing the device spec: '/foo:1'."),
    ("placement_log", "maybe", "argument state: invalid choice: 'maybe'"),
    ("devices", "--simulate-gpus 0", "count is the number of GPUs to simulate"),
    ("devices", "--simulate-gpus 1 --memory-limit 0", "memory_limit is a whole number of megabytes"),
    ("compare_devices", "/foo:1", "Unknown attribute 'foo'"),
    ("memwatch", "--device /foo:1", "Unknown attribute 'foo'"),
])
def test_both_magic_classes_report_bad_arguments_the_same_way(ip, magic, line, message) -> None:
    with pytest.raises(UsageError) as err:
        if magic in ("placement_log", "devices"):
            ip.run_line_magic(magic, line)
        else:
            ip.run_cell_magic(magic, line, "pass")
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)
