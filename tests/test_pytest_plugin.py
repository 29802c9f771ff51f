"""devlab's pytest plugin, as a library's CI runs it: pytest on the sample projects under
tests/plugin_samples (copied to a temporary directory), with and without `--simulate-gpus`,
reading each test's outcome from pytest's JUnit XML and the header and summary from its
output."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = Path(__file__).resolve().parent / "plugin_samples"


def _entry_point_installed() -> bool:
    """pytest loads the plugin itself where devlab's wheel registered it; else `-p`."""
    eps = importlib.metadata.entry_points(group="pytest11")
    return any(ep.value == "_devlab_pytest" for ep in eps)


@dataclass
class Run:
    returncode: int
    output: str
    outcomes: dict[str, str]  # test name -> passed, failed, skipped, error
    messages: dict[str, str]  # test name -> its failure, error or skip text


def run_sample(name: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None,
               timeout: int = 600) -> Run:
    project = tmp_path / name
    if not project.exists():
        shutil.copytree(SAMPLES / name, project)
    xml = tmp_path / f"{name}-{len(list(tmp_path.glob('*.xml')))}.xml"
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("DEVLAB_") and k != "PYTEST_ADDOPTS"
               and not k.startswith("PYTEST_XDIST")}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    environ.update(env or {})
    plugin = [] if _entry_point_installed() else ["-p", "_devlab_pytest"]
    cmd = [sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider", "-rA",
           f"--junitxml={xml}", "-o", "junit_family=xunit2", *args]
    proc = subprocess.run(cmd, cwd=project, env=environ, capture_output=True, text=True,
                          timeout=timeout)
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            test = case.get("name", "")
            outcome = "passed"
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    outcome = {"failure": "failed", "error": "error",
                               "skipped": "skipped"}[child.tag]
                    messages[test] = (child.get("message") or "") + "\n" + (child.text or "")
                    break
            # A teardown error comes after the call's pass: the error wins.
            if outcomes.get(test) != "error":
                outcomes[test] = outcome
    return Run(proc.returncode, proc.stdout + proc.stderr, outcomes, messages)


def line_of(sample: str, text: str) -> int:
    """The line number of `text` in a sample file (so the tests follow the samples' edits)."""
    lines = (SAMPLES / sample).read_text().splitlines()
    (number,) = [i for i, line in enumerate(lines, 1) if text in line]
    return number


def test_the_readmes_ci_workflow_installs_devlab_and_asks_for_simulated_gpus():
    """The workflow README shows for a CPU runner: devlab from its wheel (PyPI's `devlab` is
    another project), pytest as devlab pins it, and a pytest line whose options the plugin takes."""
    from devlab.fronts.pytest_plugin import options

    readme = (ROOT / "README.md").read_text()
    workflow = readme[readme.index("name: gpu-tests-on-cpu"):]
    workflow = workflow[:workflow.index("```")]
    runs = [line.split("- run:", 1)[1].strip() for line in workflow.splitlines() if "- run:" in line]
    install = next(r for r in runs if "devlab" in r)
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f" ci/devlab-{version}-py3-none-any.whl " in install, install
    assert not re.search(r"pip install (\S+ )*devlab(\s|$)", install)
    assert '"pytest<9"' in install and "pytest-xdist" in install
    test = runs[-1].split()
    assert test[0] == "pytest" and "-n" in test
    assert options.parse_count(test[test.index("--simulate-gpus") + 1]) == 2
    assert options.parse_size(test[test.index("--gpu-memory") + 1]) == 4096


# -- unasked: nothing -------------------------------------------------------------------------


def test_the_entry_module_imports_nothing():
    code = ("import sys, _devlab_pytest; "
            "print(sorted(m for m in ('torch', 'devlab') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_unasked_pytest_imports_neither_torch_nor_devlab(tmp_path):
    run = run_sample("notorch", tmp_path)
    assert run.outcomes == {"test_nothing_imported": "passed"}, run.output
    assert "devlab:" not in run.output


def test_unasked_gated_tests_skip(tmp_path):
    run = run_sample("gated", tmp_path)
    assert run.outcomes == {"test_matmul_on_gpu": "skipped", "test_module_to_gpu": "skipped",
                            "test_two_gpus": "skipped", "test_on_cpu": "passed",
                            "test_conftest_saw_cuda": "skipped"}, run.output
    assert "simulated GPU" not in run.output


# -- asked: the gated tests run ---------------------------------------------------------------


def test_gated_tests_run_with_simulate_gpus(tmp_path):
    run = run_sample("gated", tmp_path, "--simulate-gpus", "2")
    assert set(run.outcomes.values()) == {"passed"} and len(run.outcomes) == 5, run.output
    header = run.output.split("collected")[0]
    assert "devlab: 2 simulated GPUs (no GPU model)" in header
    cannot = next(line for line in header.splitlines() if line.startswith("devlab cannot check"))
    for limit in ("Triton", "TF32", "reduction order", "timing", "driver"):
        assert limit in cannot
    assert "3 of 5 tests ran on simulated GPUs" in run.output


def test_the_environment_asks_too(tmp_path):
    run = run_sample("gated", tmp_path, env={"DEVLAB_SIMULATE_GPUS": "1",
                                             "DEVLAB_SIMULATE_GPU_MODEL": "T4"})
    assert run.outcomes["test_matmul_on_gpu"] == "passed", run.output
    assert run.outcomes["test_two_gpus"] == "skipped"  # one GPU: its own gate skips it
    from devlab import simulated
    from devlab._helpers.sizes import format_bytes
    from devlab.engine.gpu_model import capacity

    t4 = format_bytes(capacity.total_memory(simulated.gpu_spec("T4")))  # as torch reports a T4's
    assert f"devlab: 1 simulated GPU, model T4, {t4} each (the model's" in run.output


def test_model_memory_and_topology_in_the_header(tmp_path):
    run = run_sample("gated", tmp_path, "--simulate-gpus", "2", "--gpu-model", "a100",
                     "--gpu-memory", "1GiB", "--gpu-topology", "nvswitch-a100")
    assert run.returncode == 0, run.output
    assert ("devlab: 2 simulated GPUs, model A100-80GB, 1.0 GiB each, collectives timed on "
            "nvswitch-a100") in run.output


@pytest.mark.parametrize(("args", "says"), [
    (["--simulate-gpus", "two"], "a whole number of at least 1"),
    (["--simulate-gpus", "0"], "at least 1"),
    (["--simulate-gpus", "2", "--gpu-memory", "lots"], "such as 1GiB, 512MiB or 16GB"),
    (["--simulate-gpus", "2", "--gpu-memory", "100KiB"], "at least 1MiB"),
    (["--simulate-gpus", "2", "--gpu-model", "X100"], "the models are T4"),
    (["--simulate-gpus", "2", "--gpu-topology", "pcie3-p2p"], "give --gpu-model too"),
    (["--simulate-gpus", "2", "--gpu-model", "T4", "--gpu-topology", "moon"],
     "the topologies are"),
    (["--simulate-gpus", "2", "--gpu-leaks", "maybe"], "one of report, fail, off"),
    (["--gpu-model", "T4"], "add --simulate-gpus N"),
])
def test_bad_options_are_usage_errors(tmp_path, args, says, capsys, monkeypatch):
    # In this process, not a pytest of its own: a bad option stops pytest before any GPU is
    # simulated (checked below), so nothing is left to leak into this session.
    project = tmp_path / "notorch"
    shutil.copytree(SAMPLES / "notorch", project)
    for name in [k for k in os.environ if k.startswith("DEVLAB_")] + ["PYTEST_ADDOPTS"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(project)
    plugin = [] if _entry_point_installed() else ["-p", "_devlab_pytest"]
    code = pytest.main([*plugin, "-p", "no:cacheprovider", "-s", *args, str(project)])
    out = capsys.readouterr()
    assert code == 4, out.out + out.err  # pytest's usage error
    assert says in out.out + out.err
    simulated = sys.modules.get("devlab.engine.simulated")
    assert simulated is None or not simulated.is_active()
    assert not [k for k in os.environ if k.startswith("DEVLAB_SIMULATE")]


# -- the bugs CPU-only CI lets through ---------------------------------------------------------

SEEDED = ("test_plain_attribute_left_on_cpu", "test_tensor_on_the_wrong_gpu",
          "test_non_blocking_copy_read_before_sync", "test_freed_while_another_stream_uses_it",
          "test_offloaded_tensor_freed_before_its_copy", "test_oom_back_off")


def test_seeded_bugs_pass_on_plain_cpu(tmp_path):
    run = run_sample("seeded", tmp_path)
    assert len(run.outcomes) == 12 and set(run.outcomes.values()) == {"passed"}, run.output


def test_seeded_bugs_fail_on_simulated_gpus_and_correct_code_passes(tmp_path):
    run = run_sample("seeded", tmp_path, "--simulate-gpus", "2", "--gpu-memory", "32MiB")
    failed = {t for t, o in run.outcomes.items() if o == "failed"}
    assert failed == set(SEEDED), run.output
    assert len(run.outcomes) == 12
    msg = run.messages
    mixed = "Expected all tensors to be on the same device, but found at least two devices"
    assert f"{mixed}, cuda:0 and cpu!" in msg["test_plain_attribute_left_on_cpu"]
    assert f"{mixed}, cuda:1 and cuda:0!" in msg["test_tensor_on_the_wrong_gpu"]
    assert "CUDA out of memory. Tried to allocate 256.00 MiB" in msg["test_oom_back_off"]
    assert "OutOfMemoryError" in msg["test_oom_back_off"]
    sample = "seeded/test_seeded.py"
    read = msg["test_non_blocking_copy_read_before_sync"]
    assert "non_blocking copy from cuda:0 to the host was read before" in read
    copy_line = line_of(sample, 'host = loss.to("cpu", non_blocking=True)')
    assert re.search(rf"queued at: \S*test_seeded.py:{copy_line} ", read), read
    assert re.search(rf"read at: +\S*test_seeded.py:{copy_line + 1} ", read), read
    freed = msg["test_freed_while_another_stream_uses_it"]
    assert "was freed while work queued on stream" in freed
    assert re.search(rf"queued at: \S*test_seeded.py:{line_of(sample, 'y = x * 2')} ", freed)
    assert re.search(rf"freed at: +\S*test_seeded.py:{line_of(sample, 'del x  #')} ", freed)
    offloaded = msg["test_offloaded_tensor_freed_before_its_copy"]
    assert ("was freed while a non_blocking copy to the host queued on stream" in offloaded
            and "the host then reads that tensor's values" in offloaded), offloaded
    copy_line = line_of(sample, 'saved = t.to("cpu", non_blocking=True)')
    assert re.search(rf"queued at: \S*test_seeded.py:{copy_line} in offload", offloaded)
    assert re.search(rf"freed at: +\S*test_seeded.py:{line_of(sample, 'del act  #')} ",
                     offloaded)


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                    reason="the library copy's tests compare it with the installed Lightning")
def test_bugs_seeded_in_a_copy_of_lightning(tmp_path):
    tests = ("test_move_data_to_device_and_back", "test_positional_encoding_on_the_modules_device",
             "test_module_cuda_with_an_index", "test_batch_size_backs_off_on_oom",
             "test_gather_all_tensors_of_uneven_sizes")
    cases = [f"{test}[{device}-{source}]" for test in tests for device in ("cpu", "cuda")
             for source in ("lightning", "copy")]
    cpu = run_sample("library_copy", tmp_path)
    assert cpu.returncode == 0, cpu.output  # CPU-only CI is green: the CUDA variants skip
    assert cpu.outcomes == {c: "skipped" if "[cuda-" in c else "passed" for c in cases}, cpu.output
    gpu = run_sample("library_copy", tmp_path, "--simulate-gpus", "2", "--gpu-memory", "256MiB")
    failed = {c for c, o in gpu.outcomes.items() if o == "failed"}
    assert failed == {f"{test}[cuda-copy]" for test in tests}, gpu.output
    assert len(gpu.outcomes) == 20 and list(gpu.outcomes.values()).count("passed") == 15
    msg = {test: gpu.messages[f"{test}[cuda-copy]"] for test in tests}
    copy = "library_copy/copied_lightning"
    moved = msg["test_move_data_to_device_and_back"]
    assert "non_blocking copy from cuda:0 to the host was read before" in moved
    queued = line_of(f"{copy}/apply_func.py", "data_output = data.to(device, **kwargs)")
    assert re.search(rf"queued at: \S*copied_lightning/apply_func.py:{queued} in batch_to", moved)
    read = line_of("library_copy/test_copied.py", 'assert back["x"].tolist() == ')
    assert re.search(rf"read at: +\S*test_copied.py:{read} ", moved), moved
    mixed = "Expected all tensors to be on the same device, but found at least two devices"
    assert f"{mixed}, cuda:0 and cpu!" in msg["test_positional_encoding_on_the_modules_device"]
    assert f"{mixed}, cuda:1 and cuda:0!" in msg["test_module_cuda_with_an_index"]
    oom = msg["test_batch_size_backs_off_on_oom"]  # the back-off let CUDA's own error through
    assert "OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB" in oom, oom
    gathered = msg["test_gather_all_tensors_of_uneven_sizes"]  # a rank's, through mp.spawn
    sizes = line_of(f"{copy}/distributed.py",
                    "torch.distributed.all_gather(local_sizes, local_size, group=group)")
    assert re.search(rf'copied_lightning/distributed.py", line {sizes}, in _gather_all_tensors',
                     gathered), gathered
    assert "RuntimeError: No backend type associated with device type cpu" in gathered


# -- the compute capability's rules, as torch applies them on the board ---------------------


def test_compute_capability_rules_of_the_modeled_board(tmp_path):
    tests = {"test_native_bf16", "test_flash_attention_forward", "test_fp8_matmul"}
    cpu = run_sample("capability", tmp_path)
    assert cpu.outcomes == dict.fromkeys(tests, "skipped"), cpu.output
    t4 = run_sample("capability", tmp_path, "--simulate-gpus", "1", "--gpu-model", "T4")
    assert t4.outcomes == dict.fromkeys(tests, "failed"), t4.output  # as on a real T4
    flash = t4.messages["test_flash_attention_forward"]
    assert "RuntimeError: No available kernel. Aborting execution." in flash
    assert ("Flash attention only supports gpu architectures in the range [sm80, sm121]. "
            "Attempting to run on a sm 7.5 gpu.") in t4.output  # torch's warning, in the summary
    assert ("torch._scaled_mm is only supported on CUDA devices with compute capability >= 9.0 "
            "or 8.9") in t4.messages["test_fp8_matmul"]
    h100 = run_sample("capability", tmp_path, "--simulate-gpus", "1", "--gpu-model", "H100")
    assert h100.outcomes == dict.fromkeys(tests, "passed"), h100.output


def test_cuda_visible_devices_hides_gpus_in_the_test_process_as_in_its_children(tmp_path):
    run = run_sample("visible", tmp_path, "--simulate-gpus", "2", env={
        "CUDA_VISIBLE_DEVICES": "1", "EXPECT_GPUS": "1", "EXPECT_MACHINE": "2"})
    assert set(run.outcomes.values()) == {"passed"} and len(run.outcomes) == 2, run.output
    assert ("devlab: 2 simulated GPUs (no GPU model), memory: the host's (--gpu-memory sets a "
            "limit); CUDA_VISIBLE_DEVICES='1' shows 1 of them to this process") in run.output
    hidden = run_sample("visible", tmp_path, "--simulate-gpus", "2",
                        env={"CUDA_VISIBLE_DEVICES": "", "EXPECT_MACHINE": "2"})
    assert hidden.outcomes == {"test_the_process_and_its_child_see_the_same_gpus": "skipped",
                               "test_a_child_told_to_see_none_sees_none": "passed"}, hidden.output
    both = run_sample("visible", tmp_path, "--simulate-gpus", "2",
                      env={"EXPECT_GPUS": "2", "EXPECT_MACHINE": "2"})
    assert set(both.outcomes.values()) == {"passed"}, both.output


# -- each test afresh, the marker, leaks ------------------------------------------------------


def test_isolation_marker_and_leak_report(tmp_path):
    run = run_sample("isolation", tmp_path, "--simulate-gpus", "2")
    assert run.outcomes.pop("test_needs_four") == "skipped", run.output
    assert set(run.outcomes.values()) == {"passed"}, run.output
    assert ("needs 4 simulated GPUs; 2 simulated (pytest --simulate-gpus 4 runs it)"
            in run.messages["test_needs_four"])
    assert "1 passing test left memory allocated on simulated GPUs" in run.output
    assert re.search(r"test_isolation.py::test_leaks_a_tensor: 1.0 MiB on cuda:0", run.output)


def test_gpu_leaks_fail_makes_a_leak_an_error(tmp_path):
    run = run_sample("isolation", tmp_path, "--simulate-gpus", "2", "--gpu-leaks=fail",
                     "-k", "leaks or afresh")
    assert run.outcomes == {"test_leaks_a_tensor": "error", "test_b_starts_afresh": "passed"}, \
        run.output
    assert "left 1.0 MiB on cuda:0 allocated" in run.messages["test_leaks_a_tensor"]


@pytest.mark.skipif(importlib.util.find_spec("xdist") is None,
                    reason="needs pytest-xdist (the test extra has it)")
def test_xdist_workers_simulate_too(tmp_path):
    run = run_sample("gated", tmp_path, "--simulate-gpus", "2", "-n", "2")
    assert set(run.outcomes.values()) == {"passed"} and len(run.outcomes) == 5, run.output
    assert "3 of 5 tests ran on simulated GPUs" in run.output


# -- the frameworks people test with, and the processes tests start ----------------------------


@pytest.mark.skipif(importlib.util.find_spec("expecttest") is None,
                    reason="torch.testing._internal needs expecttest (the test extra has it)")
def test_unittest_and_instantiate_device_type_tests(tmp_path):
    before = run_sample("frameworks", tmp_path)
    assert before.outcomes == {"test_cuda_sum": "skipped", "test_add_cpu": "passed"}, \
        before.output
    after = run_sample("frameworks", tmp_path, "--simulate-gpus", "1")
    assert after.outcomes == {"test_cuda_sum": "passed", "test_add_cpu": "passed",
                              "test_add_cuda": "passed"}, after.output


DECORATED = {"test_trainer_fits_on_gpu", "test_trainer_on_the_second_gpu", "test_fabric_bf16_mixed",
             "test_gpt2_on_gpu_matches_cpu", "test_two_gpus", "test_on_an_accelerator",
             "test_bf16_forward", "test_nvidia_smi_lists_the_gpus"}


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None
                        for m in ("lightning", "transformers")),
                    reason="the decorators sample needs lightning and transformers")
def test_lightning_and_transformers_gpu_decorators(tmp_path):
    before = run_sample("decorators", tmp_path)
    assert before.outcomes == dict.fromkeys(DECORATED, "skipped"), before.output
    assert "Requires: [GPUs>=2]" in before.messages["test_trainer_on_the_second_gpu"]
    assert "test requires multiple CUDA GPUs" in before.messages["test_two_gpus"]
    assert "nvidia-smi not found" in before.messages["test_nvidia_smi_lists_the_gpus"]
    after = run_sample("decorators", tmp_path, "--simulate-gpus", "2")
    assert after.outcomes == dict.fromkeys(DECORATED, "passed"), after.output
    assert "8 of 8 tests ran on simulated GPUs" in after.output


def test_subprocess_spawn_and_torchrun_on_nccl(tmp_path):
    before = run_sample("processes", tmp_path)
    assert set(before.outcomes.values()) == {"skipped"}, before.output
    after = run_sample("processes", tmp_path, "--simulate-gpus", "2")
    assert after.outcomes == {"test_subprocess_sees_the_gpus": "passed",
                              "test_spawn_nccl_all_reduce": "passed",
                              "test_torchrun_nccl": "passed"}, after.output
