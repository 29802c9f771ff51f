"""Every lesson notebook, in every place it runs: one test per (notebook, language, environment).

Each notebook in notebooks/ runs top to bottom in a real kernel in each environment of
`lesson_envs.ENVS` (no GPU; DEVLAB_SIMULATE_GPUS=2; DEVLAB_SIMULATE_GPUS=1, one GPU as on
Colab's GPU runtime; through binder/start; a Colab-like Python 3.12 environment), and the test
reads what a learner sees:

- no cell raises, except a lesson's intended errors (`INTENDED`, in cells tagged
  raises-exception); cells tagged so because they cannot run on one real GPU must run here;
- `devlab.lesson.setup` says in one line what it did in that environment, and nothing more;
- the lesson's claims hold, asserted from what machine load cannot move: byte counts,
  modeled times, counts of copies and host syncs, values compared with the CPU.

A notebook without claims here yet (a new lesson) gets the first two checks. Each translation in
notebooks/<lang>/ (built by tools/i18n.py, with the English code) runs in each kind of
interpreter the English notebook runs in (`TRANSLATED_ENVS`), and is read as its English notebook
(`i18n.english_view`: the English cells' sources, the translation's own outputs), so every check
and claim holds for it as written: its outputs are the English lesson's wherever they are not
prose. Each run writes its error count and time to test-artifacts/lessons/
(`lesson_envs.report`). A `plain` run is executed once per test run and is also the one
tests/test_render.py renders (`lesson_envs.plain_run`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest
import torch
from lesson_envs import (
    ENVS,
    NOTEBOOKS,
    ROOT,
    Env,
    colab_python,
    colab_versions,
    report,
    run,
    shared_dir,
)
from nbutil import errors, html, run_cells, stream, text

from devlab.engine.simulated import gpu_spec
from tools import i18n

pytestmark = [
    pytest.mark.notebook,
    pytest.mark.skipif(torch.cuda.is_available(), reason="the environments stand in for a "
                       "machine without a GPU; a real GPU would change what they show"),
]

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
GPU0 = "/job:localhost/replica:0/task:0/device:GPU:0"
GPU1 = "/job:localhost/replica:0/task:0/device:GPU:1"
WIDGET = "application/vnd.jupyter.widget-view+json"
T4 = "modeled from NVIDIA T4 (16 GB, PCIe) specifications, not measured"

# A lesson's intended errors: (notebook stem, start of the cell's source) -> the error's name.
INTENDED = {
    ("02-memory", "%%memwatch --device /GPU:0\nmore = []"): "OutOfMemoryError",
    ("02-memory", "%%memwatch --device /GPU:0\npieces = "): "OutOfMemoryError",
}


# English, then each translation (notebooks/<lang>/<the same name>).
LANGS = ["en", *i18n.LANGUAGES]
# A translation's code is the English code token for token (tools/i18n.py's check,
# tests/test_i18n.py), but a cell magic gets its body with the translated comments and a
# traceback quotes them, which each interpreter's Python, IPython and locale handle: so each
# translation runs once in each kind of interpreter; the English notebook runs in all five
# environments. The plain, sim2 and sim1 environments are one interpreter (this checkout's
# venv; only devlab's GPU count differs, and devlab's own output is the same in every
# language), and Binder's venv is that interpreter again: the same Python binary, with IPython,
# ipykernel and nbconvert at the versions the checkout's venv has (both install from one
# registry), in a UTF-8 locale as plain's kernel is (C.UTF-8, or Python's coercion of the C
# locale to it). What Binder adds (its packages as binder/requirements.txt resolves them, one
# core, its memory and time limits) depends on the code alone, which the English notebook's
# Binder run checks: in a fresh-clone run, a translation's peak there was within 55 MiB of its
# English notebook's, either side, and 709 MiB at most of the 2 GB. So a translation runs in
# plain and in the Colab-like interpreter (Python 3.12, IPython 7.34, ipykernel 6.17).
TRANSLATED_ENVS = {"plain", "colab"}


def _param(path: Path, lang: str, env: Env) -> object:
    marks = [pytest.mark.binder] if env.name == "binder" else []
    if env.name == "colab":
        marks.append(pytest.mark.skipif(
            colab_python() is None, reason="the Colab-like environment (Python 3.12, a CUDA "
            "build of torch) is built by the compatibility job: bash scripts/compat.sh --colab"))
    name = path.stem if lang == "en" else f"{path.stem}-{lang}"
    return pytest.param(path, lang, env, id=f"{name}-{env.name}", marks=marks)


@pytest.mark.parametrize(("path", "lang", "env"),
                         [_param(p, lang, e) for p in NOTEBOOKS for lang in LANGS for e in ENVS
                          if lang == "en" or e.name in TRANSLATED_ENVS])
def test_lesson(path: Path, lang: str, env: Env, tmp_path: Path,
                tmp_path_factory: pytest.TempPathFactory) -> None:
    source = path if lang == "en" else path.parent / lang / path.name
    ran = run(source, env, tmp_path, shared_dir(tmp_path_factory.getbasetemp()))
    if lang != "en":
        ran.nb = i18n.english_view(ran.nb, nbformat.read(path, as_version=4))
    code = [c for c in ran.nb.cells if c.cell_type == "code"]
    raised = [c for c in code if errors(c)]
    figures = {"seconds": round(ran.seconds, 1), "errors": len(raised),
               "intended": sum(intended(path.stem, c) is not None for c in raised)}
    if ran.peak_mib is not None:
        figures["peak_rss_mib"] = round(ran.peak_mib)
    if env.name == "colab":
        figures["versions"] = found = colab_versions(colab_python())
        # What Colab runs, and devlab as its set-up cell installed it, not this checkout.
        assert found["python"].startswith("3.12.") and found["ipython"].startswith("7.34.")
        assert found["ipykernel"].startswith("6.17.") and found["ipywidgets"].startswith("7.7.")
        assert "+cpu" not in found["torch"] and not found["devlab"].startswith(str(ROOT))
    report(path.name if lang == "en" else f"{path.stem}.{lang}.ipynb", env, figures, ran.nb)
    check_errors(path.stem, code)
    check_setup_line(path.stem, ran.nb, env)
    claims = CLAIMS.get(path.stem)
    if claims is not None:
        claims(ran.nb, env)
    if env.name == "binder":
        from lesson_envs import BINDER_MEMORY_LIMIT, BINDER_TIME_LIMIT

        assert ran.peak_mib is not None and ran.peak_mib * 2**20 < BINDER_MEMORY_LIMIT, (
            f"{path.name}: peak {ran.peak_mib:.0f} MiB is over mybinder's 2 GB")
        assert ran.seconds < BINDER_TIME_LIMIT, f"{path.name}: {ran.seconds:.0f} s on one core"


# -- what every lesson must show -----------------------------------------------------------------

def intended(stem: str, cell: nbformat.NotebookNode) -> tuple[str, str] | None:
    """The `INTENDED` entry of this cell, if it is one."""
    return next((k for k in INTENDED if k[0] == stem and cell.source.startswith(k[1])), None)


def check_errors(stem: str, code: list[nbformat.NotebookNode]) -> None:
    """Errors only where the lesson means them, and each of those where it means it."""
    unexpected, seen = [], set()
    for cell in code:
        for err in errors(cell):
            key = intended(stem, cell)
            if key is None or INTENDED[key] != err.ename:
                unexpected.append(f"{cell.source.splitlines()[0]!r}: {err.ename}: {err.evalue[:300]}")
            else:
                assert "raises-exception" in cell.metadata.get("tags", []), (
                    f"{stem}: an intended error's cell must be tagged raises-exception")
                seen.add(key)
    assert not unexpected, f"{stem}: unexpected errors:\n" + "\n".join(unexpected)
    missing = [k[1] for k in INTENDED if k[0] == stem and k not in seen]
    assert not missing, f"{stem}: the lesson's intended error did not happen in {missing}"


def setup_said(nb: nbformat.NotebookNode) -> str | None:
    """What `devlab.lesson.setup` printed, or None if the notebook does not call it."""
    cells = [c for c in nb.cells if c.cell_type == "code" and "devlab.lesson.setup(" in c.source]
    if not cells:
        return None
    assert len(cells) == 1, "one set-up call per lesson"
    said = [line for line in stream(cells[0]).splitlines() if line.startswith("devlab.lesson:")]
    assert len(said) == 1, text(cells[0])
    return stream(cells[0])


def check_setup_line(stem: str, nb: nbformat.NotebookNode, env: Env) -> None:
    said = setup_said(nb)
    if said is None:
        return
    call = next(c.source for c in nb.cells
                if c.cell_type == "code" and "devlab.lesson.setup(" in c.source)
    wanted = int(re.search(r"setup\(gpus=(\d+)", call)[1])
    line = next(line for line in said.splitlines() if line.startswith("devlab.lesson:"))
    # One line: nothing this lesson needs is missing in any of these environments.
    assert [ln for ln in said.splitlines() if ln.strip() and not ln.startswith("devlab.lesson:")
            and not ln.startswith("Num GPUs")] == [], said
    if env.simulate is None:
        assert f"no GPU here, so devlab simulates {wanted}" in line, line
    else:
        assert f"{env.simulate} simulated GPU{'s' if env.simulate != 1 else ''} from " \
               f"DEVLAB_SIMULATE_GPUS={env.simulate}" in line, line
        if env.simulate < wanted:
            assert f"split into {wanted} logical GPUs" in line, line
        if env.simulate > wanted:
            assert "hidden (set_visible_devices)" in line, line
    if "model=\"T4\"" in call:
        assert T4.replace("modeled", "GPU times are modeled") in line, line
    gpus = ", ".join(f"/GPU:{i} = cuda:{i}" for i in range(wanted))
    assert f"GPUs: {gpus} (simulated, CPU-backed" in line, line


# -- each lesson's claims ------------------------------------------------------------------------

def cell_with(nb: nbformat.NotebookNode, snippet: str) -> nbformat.NotebookNode:
    """The one code cell whose source contains `snippet`."""
    found = [c for c in nb.cells if c.cell_type == "code" and snippet in c.source]
    assert len(found) == 1, f"{len(found)} cells contain {snippet!r}"
    return found[0]


def widgets(cell: nbformat.NotebookNode) -> list[dict]:
    return [o.data[WIDGET] for o in cell.outputs
            if o.output_type == "display_data" and WIDGET in o.data]


def pngs(cell: nbformat.NotebookNode) -> list[str]:
    return [o.data["image/png"] for o in cell.outputs
            if o.output_type in ("execute_result", "display_data") and "image/png" in o.data]


def claims_01(nb: nbformat.NotebookNode, env: Env) -> None:
    said = text(cell_with(nb, "devlab.lesson.setup("))
    assert f"Num GPUs Available:  {env.physical_gpus(2)}" in said
    assert "simulated" in html(cell_with(nb, "%devices"))
    # nvidia-smi: the simulated boards' table under its banner, one row per GPU (lessons are
    # tested on simulated GPUs; on a real GPU NVIDIA's own prints its table).
    smi = text(cell_with(nb, "!nvidia-smi"))
    assert "simulated GPU" in smi.splitlines()[0] and "Processes:" in smi, smi
    assert [ln.split()[1] for ln in smi.splitlines()
            if re.match(r"\|\s+\d+\s+\S", ln) and "MiB" not in ln] == ["0", "1"], smi
    logged = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("a = torch.tensor"))
    assert f"Executing op aten::mm in device {CPU0}" in html(logged)
    on_gpu = html(cell_with(nb, "%%device /GPU:0 --log"))
    assert f"Executing op aten::mm in device {GPU0}" in on_gpu and "Host sync" in on_gpu
    copied = html(cell_with(nb, "%%placement_log\na_cpu"))
    assert f"Copy 3.8 MiB from {CPU0} to {GPU0}" in copied
    assert text(cell_with(nb, 'with devlab.device("/device:GPU:1")')) == (
        f"(device(type='cuda', index=1), '{GPU1}')")
    unknown = text(cell_with(nb, "%%device /device:GPU:2\n"))
    assert "GPU:2 unknown device" in unknown and GPU1 in unknown
    assert "placed on " + GPU0 in html(cell_with(nb, "%%device /device:GPU:2 --soft --log"))


def claims_02(nb: nbformat.NotebookNode, env: Env) -> None:
    assert text(cell_with(nb, "LogicalDeviceConfiguration(memory_limit=256)")).strip() == \
        f"{env.physical_gpus(1)} Physical GPU, 1 Logical GPUs"
    assert "cannot be modified after being initialized" in text(cell_with(nb, "set_memory_growth(gpus[0], False)"))
    # Growth on and off in a fresh process on a modeled T4: off reserves nine tenths of the
    # memory left after the CUDA context at the first tensor; on, only the tensors' 128 MiB.
    from devlab.engine import simulated
    from devlab.engine.gpu_model import capacity

    fresh = cell_with(nb, "devlab.memory.run_fresh(four_blocks")
    lines = re.findall(r"memory growth (on|off) ?: allocated (\d+) MiB, reserved (\d+) MiB "
                       r"of (\d+) MiB", text(fresh))
    said = {growth: tuple(map(int, numbers)) for growth, *numbers in lines}
    t4 = simulated.gpu_spec("T4")
    total_mib = capacity.total_memory(t4) / 2**20
    free_mib = total_mib - capacity.context_bytes(t4) / 2**20
    assert said["on"] == (128, 128, round(total_mib))
    allocated, reserved, total = said["off"]
    assert allocated == 128 and total == round(total_mib)
    assert 0.9 * free_mib - 1 <= reserved <= 0.9 * free_mib + 2
    assert len(pngs(fresh)) == 2
    grew = text(cell_with(nb, "%%memwatch --device /GPU:0\nblocks"))
    # The prose: up to 192 MiB, back down to half, under the 256 MB limit set above.
    assert "GPU:0 (modeled T4): peak 192.0 MiB" in grew and "still held 96.0 MiB" in grew
    assert "limit 256.0 MiB" in grew
    assert "<table class='devlab-memory-summary'>" in html(cell_with(nb, "%%memwatch --device /GPU:0\nblocks"))
    over = cell_with(nb, "%%memwatch --device /GPU:0\nmore")
    (err,) = errors(over)
    # CUDA's words for a per-process limit on a T4 (set_per_process_memory_fraction)
    assert "Tried to allocate 32.00 MiB. GPU 0 has a total capacity of 14.75 GiB" in err.evalue
    assert "256.00 MiB allowed" in err.evalue
    assert "peak 256.0 MiB" in text(over) and "100% at peak" in text(over)
    after = text(cell_with(nb, 'print(f"GPU 0 holds'))
    assert "GPU 0 holds 256 MiB in 5 + 3 tensors" in after  # the five that fit, and `blocks`
    assert "after freeing: 0 MiB" in after and "device='cuda:0'" in after
    # Freed, but still reserved: the allocator keeps the 64 MiB segment until empty_cache().
    cached = text(cell_with(nb, "def report(when)"))
    assert re.search(r"with x: +allocated +64 MiB", cached)
    held = int(re.search(r"after del x: +allocated +0 MiB, reserved +(\d+) MiB", cached)[1])
    assert held >= 64
    assert re.search(r"after empty_cache: +allocated +0 MiB, reserved +0 MiB", cached)
    # NVML, read in the kernel with pynvml (no second process: Binder's 2 GB): this process's
    # figure is the modeled T4's CUDA context over the allocator's reserved memory, not what
    # tensors use; the gap the cell prints is that context, and %%memwatch draws NVML's line.
    cell = cell_with(nb, "def nvml_report(when)")
    nvml = text(cell)
    context = capacity.context_bytes(t4) >> 20
    rows = {when: tuple(map(int, numbers)) for when, *numbers in re.findall(
        r"^(with x|after del x|after empty_cache): +NVML +(\d+) MiB, reserved +(\d+) MiB, "
        r"allocated +(\d+) MiB$", nvml, re.M)}
    assert set(rows) == {"with x", "after del x", "after empty_cache"}, nvml
    assert all(got == reserved + context for got, reserved, _ in rows.values()), nvml
    assert rows["with x"][1] >= 64 and rows["with x"][2] >= 64, nvml
    assert rows["after del x"][0] == rows["with x"][0], nvml  # freed, still reserved
    assert rows["after del x"][2] == rows["with x"][2] - 64, nvml
    assert rows["after empty_cache"][0] < rows["after del x"][0], nvml
    assert (f"NVML - reserved: {context} MiB, this process's CUDA context (modeled by devlab "
            "from published measurements)") in nvml, nvml
    # The chart draws NVML's used line beside allocated and the limit (its image names its
    # lines); reserved is drawn where a sample found it apart from allocated, which a loaded
    # machine's sampler thread may miss in the cell's 0.2 s after `del x`.
    (alt,) = re.findall(r'<img src="data:image/png[^"]*" alt="memory chart: ([^"]*)"', html(cell))
    drawn = set(alt.split(", "))
    label = "GPU:0 (modeled T4)"
    assert {label, f"{label} NVML used", f"{label} limit"} <= drawn <= {
        label, f"{label} NVML used", f"{label} limit", f"{label} reserved"}, alt
    # Fragmentation: half of 240 MiB free in 4 MiB holes, and 24 MiB do not fit.
    pieces = cell_with(nb, "%%memwatch --device /GPU:0\npieces")
    assert re.search(r"every other freed: +allocated 120 MiB, reserved 240 MiB", text(pieces))
    (frag,) = errors(pieces)
    assert "Tried to allocate 24.00 MiB" in frag.evalue
    assert "120.00 MiB is reserved by PyTorch but unallocated" in frag.evalue
    assert re.search(r"all freed: +allocated +0 MiB, reserved +0 MiB",
                     text(cell_with(nb, "del pieces\ntorch.cuda.empty_cache()")))
    # The allocation timeline names the cell's own lines: the model, the batch, the step.
    traced = html(cell_with(nb, "%%memwatch --device /GPU:0 --trace"))
    assert "Allocation timeline" in traced and "<svg" in traced and "<script" not in traced
    table = traced[traced.index("<table", traced.index("Allocation timeline")):]
    # A cell is In[N] where the kernel maps its file to its number (IPython 8); Colab's
    # IPython 7 has no such map, and the line names the cell's file.
    assert len(re.findall(r"<code>(In\[\d+\]|[^<]*ipykernel_\d+/\d+\.py):\d+ ", table)) >= 3
    sampled = text(cell_with(nb, "from devlab.memory import Sampler"))
    assert "GPU:0 (modeled T4): peak " in sampled and "(+64.0 MiB)" in sampled
    assert "CPU:0 (process RSS)" in sampled
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    if state:  # the live charts reached the notebook (where the runner keeps widget state)
        frames = [o for m in state["state"].values() if m["model_name"] == "OutputModel"
                  for o in m["state"]["outputs"] if "image/png" in o["data"]]
        assert len(frames) == 6  # one live chart per %%memwatch cell


def claims_03(nb: nbformat.NotebookNode, env: Env) -> None:
    for call in ("exercises.matmul_cpu_vs_gpu(", "exercises.parameters_on_device(",
                 "exercises.norm_logging(", "exercises.two_gpu_scaling("):
        cell = cell_with(nb, call)
        page = html(cell)
        # the progress bar, live while the exercise ran, is left as its static final state
        assert not widgets(cell), f"{call}: a live widget was left in the output"
        assert re.search(r"<div class='devlab-progress'>.*<progress value='(\d+)' max='\1'>",
                         page), f"{call}: no full progress bar"
        assert "class='devlab-exercise-table'" in page and "simulated GPU, CPU-backed" in page
        assert T4 in page, call
    for cell in [c for c in nb.cells if c.cell_type == "code" and c.source.strip().endswith(".plot()")]:
        (png,) = pngs(cell)
        assert len(png) > 1000
    # 1. The crossover, from the modeled side: the T4 is launch-bound on the smallest product
    # and compute-bound on the largest, where it wins whatever load slows the CPU by.
    matmul = html(cell_with(nb, "exercises.matmul_cpu_vs_gpu("))
    rows = re.findall(r"<tr><td[^>]*>(\d+)</td>(.*?)</tr>", matmul)
    assert rows and rows[0][0] == "16" and rows[-1][0] == "1024", matmul[:2000]
    assert "launch-bound" in rows[0][1] and "compute-bound" in rows[-1][1]
    # The CPU never wins there; under heavy load every CPU time can be noisy, and then the
    # result may only say so (load cannot make the CPU faster, but gives no least CPU time).
    winner = re.findall(r"<td[^>]*>([^<]*)</td>", rows[-1][1])[-2]
    assert winner == "GPU:0" or (winner == "too noisy to call" and "(noisy)" in rows[-1][1]), \
        rows[-1][1]
    assert re.search(r"wins from n=\d+ on|faster at every size tried|No crossover in this range|"
                     r"too noisy", matmul)
    compared = text(cell_with(nb, "%%compare_devices /CPU:0 /GPU:0"))
    assert re.search(r"GPU:0 \(modeled T4\): .* per call", compared), compared
    explained = html(cell_with(nb, "devlab.simulated.explain(lambda: x @ x)"))
    assert "aten::matmul" in explained and "compute-bound" in explained
    # 3. A host sync per step: 1000 of them, counted; on the modeled clock they cost at least
    # twice keeping the log on the device (both versions' times are modeled).
    norms = html(cell_with(nb, "exercises.norm_logging("))
    assert "made the host wait 1000 times, the on-device version 1" in norms
    ratio = float(re.search(r"keeping the log on the device was ([0-9.]+)x faster", norms)[1])
    assert ratio >= 2.0, norms
    summary = text(cell_with(nb, '"two-GPU speed-up": round('))
    assert "'host syncs (per step, on device)': [1000, 1]" in summary
    speedup = float(re.search(r"'two-GPU speed-up': ([0-9.]+)", summary)[1])
    # 5. A CUDA graph: 40 tiny kernels launched one by one wait for the host's launches; one
    # replay launches them all, so it takes well under half as long, and the values show that
    # the capture itself ran nothing.
    graphed = text(cell_with(nb, "with torch.cuda.graph(graph):"))
    times = re.findall(r"40 kernels, (?:launched one by one|one graph replay): +([0-9.]+) µs "
                       r"\((modeled on T4|measured)\)", graphed)
    assert len(times) == 2, graphed
    (eager, how), (replayed, _) = times
    assert float(replayed) < float(eager) / 2, graphed
    assert how == "modeled on T4", graphed  # every environment here simulates the T4
    assert "x[0] = 120: " in graphed, graphed
    # 8. The profiler: torch's table with the modeled kernels, the loop launch-bound, the trace
    # with a launch and a kernel per product.
    profiled = text(cell_with(nb, 'prof.key_averages().table(sort_by="cuda_time_total"'))
    assert "Self CUDA" in profiled and "CUDA total" in profiled, profiled
    assert "Failed to record CUDA event" not in profiled
    assert re.search(r"modeled: aten::mm \(matrix product, 2 MFLOP\) +.* 100 *$", profiled,
                     re.M), profiled
    ran = re.search(r"100 kernels ran for (\d+) µs of the loop's (\d+) µs on the GPU \((\d+)% "
                    r"busy; kernels modeled, the host measured\)", profiled)
    assert ran and int(ran[3]) < 50, profiled
    assert ("trace.json: {'cpu_op': 500, 'cuda_runtime': 100, 'kernel': 100, 'ac2g': 200}"
            in profiled), profiled
    # 9. A data loader that stalls the GPU: loading in the training process, the modeled T4
    # waits for the host before each step at least the loader's 40 ms sleep (the host clock
    # counts wall time outside the simulation, and a loaded machine only adds to it); with two
    # workers loading ahead it waits at most about half that (each worker loads every other
    # batch), and the kernels are the same either way.
    stalled = stream(cell_with(nb, "def gpu_during_epoch("))  # stdout: torch may warn of workers
    got = re.findall(r"^(loading in the training process|2 workers, pinned, non_blocking): GPU "
                     r"busy ([0-9.]+) ms, waited ([0-9.]+) ms for the host \(([0-9.]+) ms per "
                     r"step\)$", stalled, re.M)
    assert [g[0] for g in got] == ["loading in the training process",
                                   "2 workers, pinned, non_blocking"], stalled
    (_, busy_before, waited_before, _), (_, busy_after, waited_after, _) = got
    steps, sleep_ms = 10, 40
    # nine batches are loaded after the timed epoch's start (the first one is not timed), and
    # the GPU's step is far shorter than the sleep
    assert float(busy_before) < 0.1 * sleep_ms * steps, stalled
    assert float(waited_before) >= (steps - 1) * (sleep_ms - float(busy_before) / steps), stalled
    assert float(waited_after) < 0.6 * float(waited_before), stalled
    # pinned copies are faster than pageable ones; everything else the GPU ran is the same
    assert 0.5 * float(busy_before) < float(busy_after) <= float(busy_before), stalled
    assert re.search(r"\nGPU times: modeled on NVIDIA T4 \(16 GB, PCIe\) \(from [^)]*not measured\); "
                     r"the loader's times are this machine's\n$", stalled), stalled
    scaling = html(cell_with(nb, "exercises.two_gpu_scaling("))
    if env.physical_gpus(2) >= 2:
        # 4. Two modeled GPUs, two queues, whatever this machine's cores.
        assert speedup >= 1.8, scaling
        assert "two GPUs, two queues" in scaling
    else:
        # One GPU split in two: one queue, no speed-up, and the result says why.
        assert speedup <= 1.1, scaling
        assert "Both are logical devices of one physical GPU" in scaling
        assert "A split GPU does not scale" in scaling
    # 6. Streams: a copy on a side stream runs beside the product, on the modeled clock (a
    # T4's 64 MB copy from pinned memory takes about as long as its 2048 x 2048 product).
    streams = text(cell_with(nb, "def two_streams():"))
    got = re.fullmatch(r"one stream: ([0-9.]+) ms, two streams: ([0-9.]+) ms, (.*)\n", streams)
    assert got and got[3] == T4, streams
    one, two = float(got[1]), float(got[2])
    assert two < 0.75 * one, streams
    # 7. The host runs ahead of the GPU: right after queuing a 2048 x 2048 product, its event is
    # not done on the modeled T4; every False answer costs the host one launch, so polling ends
    # once the host's modeled time passes the product's end; after synchronize() it is done.
    asked = text(cell_with(nb, "while not done.query():"))
    got = re.fullmatch(
        r"right after queuing the product, done\.query\(\) = (True|False)\n"
        r"asked again until it was True: (\d+) more answers were False\n"
        r"after torch\.cuda\.synchronize\(\), done\.query\(\) = (True|False)\n"
        r"host \(modeled\): product queued at ([0-9.]+) ms, polling over at ([0-9.]+) ms\n"
        r"GPU \(modeled\): product done at ([0-9.]+) ms\n"
        r"GPU times: modeled on NVIDIA T4 \(16 GB, PCIe\) \(from [^)]*not measured\)\n", asked)
    assert got, asked
    polls, (queued, polled, finished) = int(got[2]), map(float, got.group(4, 5, 6))
    assert (got[1], got[3]) == ("False", "True") and polls >= 1, asked
    assert queued < finished <= polled, asked
    # the first question and each False one in the loop cost one launch, the True one nothing
    # (the cell polls on the model's host, so a loaded machine pausing the kernel between two
    # questions does not end the loop early)
    launch_ms = gpu_spec("T4").launch_latency_us / 1000
    assert polled - queued >= (polls + 1) * launch_ms - 1e-6, asked
    # ... and in wall time: ten steps of a 1024 x 1024 matrix product and its sum queued on the
    # simulated GPU's worker, a timer without a sync stops at the launches, one after it at the
    # work.
    walled = text(cell_with(nb, "def ten_steps():"))
    # Whether the GPU is still working is asked in wall time too, of the simulated GPU's
    # worker thread, before the clock stops: had it done all the work by then, the sync would
    # find nothing to wait for, and the times could not be as the first assertion says.
    got = re.fullmatch(r"no sync: +([0-9.]+) ms \(the launches\); GPU still working then: "
                       r"(True|False)\n"
                       r"with sync: +([0-9.]+) ms \(the work\)\n"
                       r"\(wall time on this machine; the simulated GPU's work is this CPU "
                       r"computing it\)\n", walled)
    assert got and float(got[1]) < 0.5 * float(got[3]), walled
    assert got[2] == "True", walled


def claims_04(nb: nbformat.NotebookNode, env: Env) -> None:
    assert text(cell_with(nb, "Create 2 virtual GPUs")).strip() == \
        f"{env.physical_gpus(1)} Physical GPU, 2 Logical GPUs"
    listed = text(cell_with(nb, "for d in devlab.config.list_logical_devices"))
    assert listed.splitlines() == ["/device:GPU:0 -> cuda:0 (1024 MB)",
                                   "/device:GPU:1 -> cuda:1 (1024 MB)"]
    table = html(cell_with(nb, "%devices"))
    assert table.count("simulated") >= 2 and GPU1 in table
    refused = text(cell_with(nb, "set_logical_device_configuration(gpus[0], None)"))
    assert "Virtual devices cannot be modified after being initialized" in refused
    replicated = cell_with(nb, "%%placement_log")
    assert "[[ 44.,  56.]," in text(replicated) and "[ 98., 128.]]" in text(replicated)
    log = html(replicated)
    for gpu in (GPU0, GPU1):
        assert f"Executing op aten::mm in device {gpu}" in log
        assert f"Copy 16 B from {gpu} to {CPU0} (aten::_to_copy)" in log
        assert f"Host sync: the host waited for {gpu}" in log
    assert "2 copies between devices (32 B)" in log and "2 host syncs" in log
    assert "Expected all tensors to be on the same device, but found at least two devices, " \
           "cuda:0 and cuda:1!" in text(cell_with(nb, "print(c[0] + c[1])"))
    replicas = text(cell_with(nb, "replicas = ["))
    assert "same as the model on the host: True" in replicas and "4 copies between devices" in replicas
    split = text(cell_with(nb, "def train_split("))
    assert "(same as on the host: True)" in split
    assert "layer 1: weights on cuda:0, gradients on cuda:0, Adam state on cuda:0" in split
    assert "layer 2: weights on cuda:1, gradients on cuda:1, Adam state on cuda:1" in split
    ddp = text(cell_with(nb, "loss.backward()  # DDP all-reduces the gradients here"))
    for rank in (0, 1):
        assert re.search(rf"\[rank{rank}\] loss on my half of the last batch: [0-9.]+ "
                         rf"\(computed on cuda:{rank}\)", ddp), ddp
    compared = text(cell_with(nb, "rank_weights = _"))
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        assert f"{name}: rank 0's on cuda:0, rank 1's on cuda:1, equal: True" in compared
    assert "same as one process on the whole batches: True" in compared
    step = html(cell_with(nb, "%%distributed -n 2 --log"))
    for gpu in (GPU0, GPU1):  # 4x16 + 16 + 16x1 + 1 float32 parameters: 388 bytes
        assert f"Broadcast 388 B on {gpu} (c10d::broadcast_)" in step
        assert f"All-reduce 388 B on {gpu} (c10d::allreduce_)" in step
    claims_ddp_scaling(nb)


def claims_05(nb: nbformat.NotebookNode, env: Env) -> None:
    code = [c for c in nb.cells if c.cell_type == "code"]
    cells = {c.source.strip().splitlines()[-1]: text(c) for c in code}  # by last line, as printed
    assert cells["cpu(), gpu(), gpu(1)"] == (
        "(device(type='cpu'),\n device(type='cuda', index=0),\n device(type='cuda', index=1))")
    assert cells["num_gpus()"] == "2"
    assert cells["try_gpu(), try_gpu(10), try_all_gpus()"] == (
        "(device(type='cuda', index=0),\n device(type='cpu'),\n"
        " [device(type='cuda', index=0), device(type='cuda', index=1)])")
    assert cells["x.device"] == "device(type='cpu')"
    assert cells["X"] == "tensor([[1., 1., 1.],\n        [1., 1., 1.]], device='cuda:0')"
    assert cells["Y"].endswith("device='cuda:1')")
    assert cells["print(Z)"] == (
        "tensor([[1., 1., 1.],\n        [1., 1., 1.]], device='cuda:0')\n"
        "tensor([[1., 1., 1.],\n        [1., 1., 1.]], device='cuda:1')\n")
    assert cells["Y + Z"].endswith("device='cuda:1')")
    assert cells["Z.cuda(1) is Z"] == "True"
    out = cells["net(X)"]
    assert out.startswith("tensor([[") and out.endswith("device='cuda:0', grad_fn=<AddmmBackward0>)")
    assert cells["net[0].weight.data.device"] == "device(type='cuda', index=0)"


def claims_ddp_scaling(nb: nbformat.NotebookNode) -> None:
    """Lessons 04 and 06: a DDP step on one and on two modeled T4s, as the communication model
    predicts it from the one-GPU times; the model's explanation and its what-ifs agree with it."""
    from devlab.engine import gpu_model

    timed = stream(cell_with(nb, "def ddp_step("))
    assert "GPU times: modeled on NVIDIA T4 (16 GB, PCIe)" in timed and "not measured" in timed
    steps = {int(n): [float(v) for v in parts] for n, *parts in re.findall(
        r"^(\d) GPUs?\s*: step\s+([\d.]+) ms = forward ([\d.]+) \+ backward ([\d.]+) \+ "
        r"optimizer ([\d.]+), [\d,]+ samples/s$", timed, re.M)}
    assert sorted(steps) == [1, 2], timed
    (t1, f, b, o), (t2, f2, b2, o2) = steps[1], steps[2]
    assert (f2, o2) == (f, o) and b2 > b  # each GPU computes as much; the backward waits
    # The model, from the one-GPU times the cell printed (to the µs): the same step on two.
    layer = 4 * 1024 * 1024, 4 * 1024  # a Linear(1024, 1024)'s gradients, as backward writes them
    sizes = [layer[1], layer[0]] * 8
    step = gpu_model.data_parallel_step(
        gpu_model.evenly_ready(sizes, b / 1e3), 2, "pcie3-host", forward=f / 1e3,
        backward=b / 1e3, optimizer=o / 1e3, gpu_name="T4")
    assert step.seconds * 1e3 == pytest.approx(t2, abs=0.01), (step, timed)
    why = text(cell_with(nb, "ring = gpu_model.bus_factor"))
    buckets = [sum(sizes[i] for i in k) / 2**20 for k in gpu_model.bucket_sizes(sizes)]
    assert f"gradients: {sum(sizes) / 1e6:.1f} MB, all-reduced at every step, in " \
           f"{len(buckets)} buckets ({', '.join(f'{k:.1f}' for k in buckets)} MiB)" in why, why
    topo = gpu_model.topology("pcie3-host")
    assert f"{topo.duplex:.1%} of it when both GPUs send at once: " \
           f"{topo.bus_gbs * topo.duplex:.2f} GB/s" in why, why
    assert "2(n-1)/n = 1 x the gradients" in why
    assert f"modeled: {step.communication * 1e3:.3f} ms of all-reduce, {step.hidden:.0%} of it " \
           f"hidden" in why, why
    assert f"2 GPUs are {2 * t1 / t2:.2f} x as fast as 1 (modeled)" in why, why
    rows = dict(re.findall(r"^(.+?)\s+[\d.]+ ms\s+[\d.]+ ms\s+([\d.]+) x$",
                           text(cell_with(nb, "def modeled(")), re.M))
    speed = {k.split(" (")[0].strip(): float(v) for k, v in rows.items()}
    assert speed["as above"] == pytest.approx(2 * t1 / t2, abs=0.01)
    # A larger batch, P2P and NVLink hide or shorten the all-reduce; a larger MLP gains nothing.
    assert speed["as above"] < speed["PCIe with peer-to-peer"] < speed["NVLink bridge"] <= 2
    assert speed["batch x 4"] > speed["as above"]
    assert speed["model x 4"] == pytest.approx(speed["as above"], abs=0.1)
    assert speed["4 micro-batches per step"] == pytest.approx(  # 3 of 4 without an all-reduce
        2 * (4 * (f + b) + o) / (3 * (f + b) + step.seconds * 1e3), abs=0.01), rows


def claims_step_timeline(nb: nbformat.NotebookNode) -> None:
    """Lesson 06: one DDP step's modeled timeline on two T4s: its parts add up, it is the step
    the cell before timed, and its all-reduces are DDP's buckets as gpu_model times them."""
    from devlab.engine import gpu_model

    timed = stream(cell_with(nb, "def ddp_step("))
    (t1, f, b, o), (t2, *_) = [[float(v) for v in m] for m in re.findall(
        r"^\d GPUs?\s*: step\s+([\d.]+) ms = forward ([\d.]+) \+ backward ([\d.]+) \+ "
        r"optimizer ([\d.]+)", timed, re.M)]
    layer = 4 * 1024 * 1024, 4 * 1024
    sizes = [layer[1], layer[0]] * 8
    step = gpu_model.data_parallel_step(
        gpu_model.evenly_ready(sizes, b / 1e3), 2, "pcie3-host", forward=f / 1e3,
        backward=b / 1e3, optimizer=o / 1e3, gpu_name="T4")
    cell = cell_with(nb, "def ddp_timeline(")
    shown = text(cell)
    gpus = re.findall(
        r"^GPU:(\d): step ([\d.]+) ms = compute ([\d.]+) ms \+ exposed communication ([\d.]+) "
        r"ms \+ idle ([\d.]+) ms; communication ([\d.]+) ms in (\d+) collectives, ([\d.]+) ms "
        r"\(\d+%\) hidden behind compute; waited ([\d.]+) ms for the slowest rank; compute "
        r"waited ([\d.]+) ms for collectives$", shown, re.M)
    assert [g[0] for g in gpus] == ["0", "1"], shown
    for _, *values in gpus:
        total, compute, exposed, idle, comm, n, hidden, ranks, waited = map(float, values)
        assert compute + exposed + idle == pytest.approx(total, abs=0.002)
        assert hidden + exposed == pytest.approx(comm, abs=0.002)
        assert total == pytest.approx(t2, abs=0.01) and compute == pytest.approx(t1, abs=0.01)
        assert n == len(step.buckets)
        assert comm == pytest.approx(step.communication * 1e3, abs=0.001)
        assert exposed == pytest.approx(step.exposed * 1e3, abs=0.05 * comm)
        assert waited == pytest.approx(exposed, abs=0.002) and ranks < 0.01
    assert "not measured" in shown
    page = html(cell)
    assert "<svg" in page and "<script" not in page and "GPU:1 NCCL" in page
    from devlab._helpers.sizes import format_bytes

    for bucket in step.buckets:  # each all-reduce, hover text naming its bucket's bytes
        assert re.search(r"nccl:all_reduce \(pcie3-host, 2 GPUs, [^)]*\): "
                         + re.escape(format_bytes(bucket.nbytes)) + ": ", page), page[:3000]


def _replay_06() -> tuple[torch.nn.Module, list[float]]:
    """Lesson 06's training in one process on the host (batches of 32), and the losses its two
    ranks compute on their last batches of 16 (before the last step)."""
    from torch import nn

    def make_model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))

    torch.manual_seed(1)
    X, y = torch.randn(64, 4), torch.randn(64, 1)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = list(zip(X.split(32), y.split(32), strict=True)) * 10
    for i, (xb, yb) in enumerate(steps):
        if i == len(steps) - 1:
            with torch.no_grad():
                last = [nn.functional.mse_loss(model(h), t).item()
                        for h, t in zip(xb.chunk(2), yb.chunk(2), strict=True)]
        opt.zero_grad()
        nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
    return model, last


def claims_06(nb: nbformat.NotebookNode, env: Env) -> None:
    # Nothing touches a GPU in the notebook, before launching or after.
    assert stream(cell_with(nb, "def make_model")).strip() == "CUDA initialized in this notebook: False"
    same = stream(cell_with(nb, "ranks = [result"))
    assert same.strip().endswith("CUDA initialized in this notebook: False")
    # Two ranks, each on its own GPU, with the losses a replay on the host computes.
    launch = cell_with(nb, "notebook_launcher(train")
    assert stream(launch).strip() == "Launching training on 2 CUDAs."
    notices = [ln for ln in stream(launch, "stderr").splitlines() if "simulated GPUs have no NCCL" in ln]
    assert len(notices) == 2, stream(launch, "stderr")  # said once by each rank
    out = stream(cell_with(nb, "results = [pickle.loads"))
    found = re.findall(r"^rank (\d) trained on cuda:(\d): loss on its last batch (\d+\.\d{4})$",
                       out, re.M)
    assert [(r, g) for r, g, _ in found] == [("0", "0"), ("1", "1")], out
    model, last = _replay_06()
    assert [float(loss) for _, _, loss in found] == [round(v, 4) for v in last]
    # Each rank's first step: its all-reduce of the gradients' bytes, on its own GPU only.
    lines = stream(cell_with(nb, "logs = [PlacementLog")).splitlines()
    grads = 4 * sum(p.numel() for p in model.parameters())  # float32 gradients: 388 B
    for rank in (0, 1):
        gpu = f"/job:localhost/replica:0/task:0/device:GPU:{rank}"
        assert f"rank {rank}: All-reduce {grads} B on {gpu} (c10d::allreduce_)" in lines, lines
        (summary,) = [ln for ln in lines if ln.strip().startswith("Placement summary")
                      and f"GPU:{rank} " in ln]
        assert f"GPU:{1 - rank}" not in summary  # nothing of this rank ran on the other GPU
        assert "0 copies between devices" in summary and f"1 collective ({grads} B)" in summary
    log0 = html(cell_with(nb, "logs[0]"))
    assert re.search(r'class="devlab-collective"[^>]*>All-reduce \d+ B on ' + GPU0, log0)
    assert f"aten::addmm in device {GPU0}" in log0
    assert f"aten::_foreach_add_ in device {GPU0}" in log0
    # The ranks end equal, and equal to one process on the host.
    assert "both ranks hold the same weights: True" in same
    assert re.search(r"^same as one process on batches of 32: True \(largest difference "
                     r"\d\.\de-\d\d\)$", same, re.M), same
    claims_ddp_scaling(nb)
    claims_pytest_plugin(nb)


def claims_pytest_plugin(nb: nbformat.NotebookNode) -> None:
    """Lesson 06's pytest cell: CPU-only CI skips the gated test; the plugin runs it on two
    simulated GPUs and fails it on the plain attribute left on the CPU, saying what simulated
    GPUs cannot check (in every environment: pytest runs in fresh processes)."""
    out = stream(cell_with(nb, "def run_pytest("))
    plain, _, plugin = out.partition("\nwith the plugin, pytest --simulate-gpus 2:\n")
    assert re.fullmatch(r"CPU-only CI \(no GPU visible\):\n"
                        r"SKIPPED \[1\] test_scaled\.py:\d+: needs a GPU\n"
                        r"=+ 1 skipped in [0-9.]+s =+\n", plain), out
    lines = plugin.splitlines()
    assert lines[0].startswith("devlab: 2 simulated GPUs (no GPU model)"), out
    (cannot,) = [ln for ln in lines if ln.startswith("devlab cannot check:")]
    assert all(word in cannot for word in ("Triton", "TF32", "timing")), out
    assert ("E       RuntimeError: Expected all tensors to be on the same device, but found at "
            "least two devices, cuda:0 and cpu!") in lines, out
    assert "1 of 1 tests ran on simulated GPUs (made a tensor on one)" in lines, out
    assert re.fullmatch(r"=+ 1 failed in [0-9.]+s =+", lines[-1]), out


CLAIMS: dict[str, Callable[[nbformat.NotebookNode, Env], None]] = {
    "01-devices-and-placement": claims_01,
    "02-memory": claims_02,
    "03-d2l-exercises": claims_03,
    "04-multi-device": claims_04,
    "05-d2l-gpus-chapter": claims_05,
    "06-frameworks": claims_06,
}


def test_every_lesson_with_claims_exists() -> None:
    assert set(CLAIMS) <= {p.stem for p in NOTEBOOKS}, "claims for a notebook that is gone"


def test_lessons_never_name_a_second_cuda_device_literally() -> None:
    """On one real GPU split in two, both logical GPUs are cuda:0: a lesson's own cells use
    `lab.gpus` or TensorFlow names, so they run there too. The d2l chapter (05) is the
    chapter's code, unmodified; its cells that name cuda:1 are tagged and named by setup."""
    literal = re.compile(r"""["']cuda:[1-9]|\.cuda\([1-9]|device=[1-9]\b""")
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if (cell.cell_type != "code" or not literal.search(cell.source)
                    or "devlab.lesson.setup(" in cell.source):
                continue
            assert "raises-exception" in cell.metadata.get("tags", []), (
                f"{path.name}: a cell names a second CUDA device literally:\n{cell.source}")
            said = next(c.source for c in nb.cells
                        if c.cell_type == "code" and "devlab.lesson.setup(" in c.source)
            assert '"separate_gpus"' in said, f"{path.name}: setup does not name those cells"



def test_a_second_lesson_in_the_same_kernel_says_what_it_cannot_have() -> None:
    """Notebook 02 used its one GPU; notebook 03's set-up, run next in the same kernel, cannot
    change GPUs in use: it names the cells that lose out, and how to restart."""
    def code(stem: str) -> list[str]:
        nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
        return [c.source for c in nb.cells if c.cell_type == "code"]

    setup_03 = next(src for src in code("03-d2l-exercises") if "devlab.lesson.setup(" in src)
    cells = run_cells(*code("02-memory"), setup_03, timeout=300)
    assert [e.ename for c in cells for e in errors(c)] == ["OutOfMemoryError"] * 2  # 02's own
    said = stream(cells[-1]).splitlines()
    assert said[0].startswith("devlab.lesson: 1 simulated GPU set up earlier in this kernel.")
    # Both lessons model the T4: only the GPU count is missing.
    assert len(said) == 2 and "so exercise 4 (two GPUs at once) will not run" in said[1]
    assert all("Kernel > Restart Kernel" in line for line in said[1:])
