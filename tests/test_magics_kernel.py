"""The notebook extension in a real Jupyter kernel: what a teacher types, what the cell shows."""

from __future__ import annotations

import pytest
from nbutil import errors, html, run_cells, stream, text

# One worker runs this module: its tests share one expensive module fixture, which
# each worker would otherwise build again.
pytestmark = [pytest.mark.notebook, pytest.mark.xdist_group("test_magics_kernel")]

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
GPU0 = "/job:localhost/replica:0/task:0/device:GPU:0"


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    logfile = tmp_path_factory.mktemp("log") / "placement.log"
    sources = {
        "load": "%load_ext devlab",
        "load_again": "%load_ext devlab",
        "devices": "%devices",
        "simulate": "%devices --simulate-gpus 1",
        "device_cell": "%%device /CPU:0\nimport torch\nx = torch.ones(2, 2)\nx @ x",
        "log_cell": "%%placement_log\ny = x @ x\nprint('between')\ny.sum()",
        "bad_name": "%%device /foo:1\nx",
        "unknown": "%%device /GPU:7\nx",
        "before_error": "import torch\ntorch.get_default_device(), torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack()",
        "error_in_cell": "%%device /GPU:0\nz = torch.ones(1)\n1/0",
        "after_error": "import torch\ntorch.get_default_device(), torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack()",
        # The case, as written: accepted, then "Error in callback … post_run_cell"
        # under every later cell, even after %placement_log off.
        "file_missing": "%placement_log on --file /nonexistent/x.log",
        "after_missing": "1 + 1",
        "off_after_missing": "%placement_log off",
        "after_off": "2 + 2",
        "line_on": f"%placement_log on --limit 5 --file {logfile}",
        "logged": "w = torch.ones(3)\nfor _ in range(20):\n    w = w + 1",
        "cell_log_while_on": "%%placement_log\nw * 2",
        "line_off": "%placement_log off",
        "not_logged": "w + 1",
        "python_switch": "import devlab\ndevlab.debugging.set_log_device_placement(True)\nv = torch.zeros(2) * 3\ndevlab.debugging.set_log_device_placement(False)",
        "device_line": "%device /CPU:0",
        "device_show": "%device",
        "device_reset": "%device --reset",
        "device_comment": "%device /CPU:0  # a comment pasted with the line",
        "memwatch_comment": "%%memwatch --device /CPU:0  # watch the CPU\nlen([0] * 10)",
        "simulate_late": "%devices --simulate-gpus 2",
        "copies": "%%placement_log\na = torch.ones(1000, 1000)\nb = a.to('cuda:0')\ns = b.sum()\ns.item()",
        "print_sync": "%%device /GPU:0 --log\nc = torch.ones(2)\nprint(c)",
        "bad_limit": "%placement_log on --limit -3",
        "help": "ip = get_ipython()\nprint(ip.find_cell_magic('device').__doc__)\nprint(ip.find_line_magic('placement_log').__doc__)\nprint(ip.find_line_magic('devices').__doc__)",
        # The case: %reload_ext devlab silently stopped the simulation (a tensor made
        # on cuda:1 then said cpu). Here there is one simulated GPU: cuda:0.
        "before_reload": "on_gpu = torch.ones(3, device='cuda:0')\n%device /GPU:0\n%placement_log --limit 7",
        "reload": "%reload_ext devlab",
        "after_reload": "print(on_gpu.device, torch.cuda.is_available(), torch.get_default_device(), "
        "torch.ones(1).device)\n%placement_log\n"
        "print(get_ipython().magics_manager.registry['PlacementMagics'])",
        "magics_after_reload": "%%device /CPU:0\ntorch.ones(1).device",
        "unload": "%unload_ext devlab",
        "gone": "%device",
        "torch_as_before": "(torch.get_default_device(), torch._C._len_torch_function_stack(), "
        "torch._C._len_torch_dispatch_stack(), torch.cuda.is_available(), "
        "torch._tensor_str._str is torch._tensor_str.__dict__['_str'] and torch._tensor_str._str.__module__)",
    }
    executed = run_cells(*sources.values())
    out = dict(zip(sources, executed, strict=False))
    out["logfile"] = logfile
    return out


def test_load_says_what_devices_there_are_once(cells) -> None:
    line = text(cells["load"]).strip()
    assert line.startswith("devlab loaded: devices /CPU:0.")
    assert "No GPU" in line
    assert "already loaded" in text(cells["load_again"])
    assert not errors(cells["load_again"])


def test_device_cell_runs_and_shows_its_result(cells) -> None:
    assert "tensor([[2., 2.]," in text(cells["device_cell"])


def test_placement_log_cell_shows_lines_and_summary_after_outputs(cells) -> None:
    out = text(cells["log_cell"])
    assert f"Executing op aten::mm in device {CPU0}" in out
    assert f"Executing op aten::sum in device {CPU0}" in out
    assert "Placement summary: 2 ops (CPU:0 2)" in out
    assert out.index("between") < out.index("Executing op aten::mm"), "the log comes after the cell's own output"
    assert 'class="devlab-placement-log"' in html(cells["log_cell"])


def test_devices_table_text_and_html(cells) -> None:
    assert CPU0 in text(cells["devices"])
    assert "<table" in html(cells["devices"]) and "No GPU" in html(cells["devices"])


def usage_error(cell) -> str:
    """IPython shows a UsageError as one line on stderr, with no traceback."""
    assert not errors(cell), "a usage error must not show a traceback"
    return stream(cell, "stderr").strip()


def test_bad_names_are_one_line_errors(cells) -> None:
    assert usage_error(cells["bad_name"]) == (
        "UsageError: Unknown attribute 'foo' is encountered while parsing the device spec: '/foo:1'."
    )
    unknown = usage_error(cells["unknown"])
    assert unknown.startswith("UsageError: /job:localhost/replica:0/task:0/device:GPU:7 unknown device.")
    assert len(unknown.splitlines()) == 1


def test_error_in_a_cell_fails_it_and_restores_everything(cells) -> None:
    (err,) = errors(cells["error_in_cell"])
    assert err.ename == "ZeroDivisionError"
    tb = "\n".join(err.traceback)
    assert "devlab/fronts/lab/magics" not in tb, "devlab's own frames are hidden from the traceback"
    before = text(cells["before_error"])
    assert before == "(device(type='cpu'), 1, 0)", "one function mode: the simulation's"
    assert text(cells["after_error"]) == before


def test_line_switch_logs_every_cell_collapsed_and_to_file(cells) -> None:
    out = text(cells["logged"])
    assert out.count("Executing op") == 5
    assert "… 16 more lines not shown" in out
    assert "Placement summary: 21 ops (CPU:0 21)" in out
    assert "Executing op" not in text(cells["not_logged"])
    saved = cells["logfile"].read_text()
    assert saved.count("Executing op aten::add") == 20
    # One block per cell that ran ops, under the cell's number: the two logged cells, not the
    # cell that turned the log off (it ran none, and once added a summary of 0 ops).
    titles = [ln for ln in saved.splitlines() if ln.startswith("# In [")]
    assert len(titles) == 2 and titles[0] != titles[1], saved
    assert saved.count("Placement summary") == 2 and "0 ops" not in saved, saved


def test_a_cell_that_logs_itself_shows_one_log_while_the_switch_is_on(cells) -> None:
    out = text(cells["cell_log_while_on"])
    assert out.count("Executing op aten::mul") == 1
    assert out.count("Placement summary") == 1


def test_python_switch_takes_effect_at_once(cells) -> None:
    out = text(cells["python_switch"])
    assert f"Executing op aten::zeros in device {CPU0}" in out
    assert f"Executing op aten::mul in device {CPU0}" in out


def test_device_line_forms(cells) -> None:
    assert f"Default device: {CPU0} (torch cpu)" in text(cells["device_line"])
    assert f"Default device: {CPU0}" in text(cells["device_show"])
    assert f"Default device: {CPU0}" in text(cells["device_reset"])


def test_a_trailing_comment_on_a_magic_line_is_a_comment(cells) -> None:
    assert f"Default device: {CPU0} (torch cpu)" in text(cells["device_comment"])
    assert not errors(cells["memwatch_comment"]) and "CPU:0 (process RSS)" in html(cells["memwatch_comment"])
    assert text(cells["memwatch_comment"]).strip().endswith("10")


def test_simulated_gpus_are_labelled_and_fixed_after_first_use(cells) -> None:
    table = text(cells["simulate"])
    assert f"{GPU0}  cuda:0" in table and "simulated" in table
    assert "1 simulated GPU (CPU-backed" in table
    assert usage_error(cells["simulate_late"]).startswith(
        "UsageError: Physical devices cannot be modified after being initialized"
    )


def test_copies_and_host_syncs_stand_out(cells) -> None:
    out = text(cells["copies"])
    assert f"Copy 3.8 MiB from {CPU0} to {GPU0} (aten::_to_copy)" in out
    assert f"Executing op aten::sum in device {GPU0}" in out
    assert f"Host sync: the host waited for {GPU0} (reading a Python number" in out
    assert "1 copy between devices (3.8 MiB) · 1 host sync" in out
    page = html(cells["copies"])
    assert 'class="devlab-copy"' in page and 'class="devlab-sync"' in page
    printed = text(cells["print_sync"])
    assert f"Host sync: the host waited for {GPU0} (printing a device tensor" in printed
    assert "device='cuda:0'" in printed


def test_bad_arguments_are_usage_errors(cells) -> None:
    assert usage_error(cells["bad_limit"]).startswith("UsageError: --limit is the number of lines to show")


def test_magics_have_full_help(cells) -> None:
    out = text(cells["help"])
    assert "%device [--soft] [--log] [--limit LIMIT] [--reset] [name]" in out
    assert "Run a cell on a device named the TensorFlow way" in out
    assert "%placement_log [--limit LIMIT] [--file FILE] [{on,off}]" in out
    assert "--simulate-gpus N" in out


def test_a_log_file_in_a_missing_folder_is_refused_when_given(cells) -> None:
    assert usage_error(cells["file_missing"]) == (
        "UsageError: Cannot write the placement log to '/nonexistent/x.log': the folder "
        "'/nonexistent' does not exist.")
    for name, shown in (("after_missing", "2"), ("off_after_missing", "Placement log off."),
                        ("after_off", "4")):
        assert text(cells[name]).strip() == shown, text(cells[name])
        assert not errors(cells[name]) and not stream(cells[name], "stderr")


def test_reload_keeps_the_simulation_and_the_session(cells) -> None:
    assert not errors(cells["reload"])
    assert text(cells["reload"]).startswith("devlab reloaded: devices /CPU:0, /GPU:0.")
    after = text(cells["after_reload"])
    assert after.startswith("cuda:0 True cuda:0 cuda:0"), after
    assert "Placement log is off." in after
    assert f"PlacementMagics(%device, %placement_log off, --limit 7, --file {cells['logfile']}, %devices)" in after
    assert "device(type='cpu')" in text(cells["magics_after_reload"])


def test_unload_removes_everything(cells) -> None:
    assert usage_error(cells["gone"]) == "UsageError: Line magic function `%device` not found."
    assert "(device(type='cpu'), 0, 0, False, 'torch._tensor_str')" in text(cells["torch_as_before"])
