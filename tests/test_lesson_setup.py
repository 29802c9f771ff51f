"""`devlab.lesson.setup`: a lesson gets the GPUs it states, however they appeared, and says so.

Real GPUs are in tests/test_real_gpu.py (torch.cuda and NVML faked at the boundary); the
notebooks themselves, in each environment, in tests/test_lessons.py.
"""

from __future__ import annotations

import pytest
import torch

import devlab
from devlab.core import config
from devlab.engine import runtime, simulated
from devlab.fronts.lab import lesson

CUDA0, CUDA1 = torch.device("cuda", 0), torch.device("cuda", 1)


def said(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_without_a_gpu_it_simulates_what_the_lesson_states(capsys) -> None:
    lab = lesson.setup(gpus=2, memory_limit=512, model="T4")
    (line,) = said(capsys)
    assert line.startswith("devlab.lesson: no GPU here, so devlab simulates 2. ")
    assert "GPUs: /GPU:0 = cuda:0, /GPU:1 = cuda:1 (simulated, CPU-backed" in line
    assert "modeled from NVIDIA T4 (16 GB, PCIe) specifications, not measured" in line
    assert lab.gpus == [CUDA0, CUDA1] and lab.names == ["/GPU:0", "/GPU:1"]
    assert simulated.model().name == "T4"
    assert [d.memory_limit for d in config.logical_devices("GPU")] == [512, 512]
    assert not runtime.is_initialized(), "settings must stay open for the lesson's own cells"
    assert repr(lab) == "Lesson(/GPU:0 -> cuda:0, /GPU:1 -> cuda:1)" and str(lab) == line


def test_it_is_public_api() -> None:
    assert devlab.lesson.setup is lesson.setup and "lesson" in devlab.__all__


def test_one_simulated_gpu_is_split_in_two_as_one_real_gpu_would_be(capsys, monkeypatch) -> None:
    monkeypatch.setenv("DEVLAB_SIMULATE_GPUS", "1")
    config.simulate_from_environment()
    lab = lesson.setup(gpus=2)
    (line,) = said(capsys)
    assert "1 simulated GPU from DEVLAB_SIMULATE_GPUS=1" in line
    assert "GPU:0 split into 2 logical GPUs of " in line and "(/GPU:0 and /GPU:1)" in line
    assert "a split GPU adds none" in line
    assert len(config.list_physical_devices("GPU")) == 1
    assert lab.gpus == [CUDA0, CUDA1]  # simulated, each logical GPU is its own device


def test_a_split_modeled_gpu_has_one_queue_so_two_products_do_not_overlap(capsys, monkeypatch) -> None:
    def two_products_at_once() -> float:
        a, b = (torch.ones(1024, 1024, device=d) for d in (CUDA0, CUDA1))
        torch.cuda.synchronize()
        # The model's host: on the wall's pace, this CPU computing the first product's values
        # (or a loaded CI machine pausing the process) would delay the second launch past the
        # first kernel's end, and no two queues would overlap.
        with simulated.modeled_host():
            start = simulated.modeled_time()
            a @ a
            b @ b
            torch.cuda.synchronize()
            return simulated.modeled_time() - start

    lesson.setup(gpus=2, model="T4")  # two physical GPUs: two queues
    two = two_products_at_once()
    config.reset()
    monkeypatch.setenv("DEVLAB_SIMULATE_GPUS", "1")
    config.simulate_from_environment()
    lesson.setup(gpus=2, model="T4")  # one GPU split in two: one queue
    split = two_products_at_once()
    assert split > 1.8 * two, (split, two)


def test_the_environments_gpus_get_the_lessons_model_and_memory_before_first_use(capsys, monkeypatch) -> None:
    monkeypatch.setenv("DEVLAB_SIMULATE_GPUS", "2")
    config.simulate_from_environment()
    assert simulated.model() is None
    lesson.setup(gpus=2, model="T4", memory_limit=1024)
    (line,) = said(capsys)
    assert "2 simulated GPUs from DEVLAB_SIMULATE_GPUS=2; given the T4 timing model and " \
           "1024 MB each, as this lesson uses (restarted before first use)" in line
    assert simulated.model().name == "T4"
    assert [d.memory_limit for d in config.logical_devices("GPU")] == [1024, 1024]


def test_more_gpus_than_the_lesson_uses_are_hidden(capsys, monkeypatch) -> None:
    monkeypatch.setenv("DEVLAB_SIMULATE_GPUS", "4")
    config.simulate_from_environment()
    lab = lesson.setup(gpus=2)
    (line,) = said(capsys)
    assert "GPU:2, GPU:3 hidden (set_visible_devices): this lesson uses 2" in line
    assert lab.gpus == [CUDA0, CUDA1] and len(config.list_physical_devices("GPU")) == 4


def test_once_gpus_are_in_use_it_changes_nothing_and_names_the_cells_affected(capsys) -> None:
    # An earlier notebook in this kernel: one simulated GPU, no model, already used.
    config.simulate_gpus(1)
    kept = torch.ones(3, device="cuda:0")
    capsys.readouterr()
    lab = lesson.setup(gpus=2, model="T4", cells={"gpus": "exercise 4", "model": "the explain cell"})
    line, *notes = said(capsys)
    assert "1 simulated GPU set up earlier in this kernel" in line
    assert lab.gpus == [CUDA0] and simulated.model() is None and kept.device == CUDA0
    assert len(notes) == 2, notes
    assert notes[0].startswith("The GPUs in this kernel are already in use, so their settings "
                               "cannot change: they have no timing model, not the T4 this lesson "
                               "uses, so the explain cell will not show the T4's times.")
    assert "This lesson uses 2 GPUs and this kernel has 1, in use already, so exercise 4 will " \
           "not run." in notes[1]
    for note in notes:
        assert note.endswith("Kernel > Restart Kernel; Colab: Runtime > Restart session) and "
                             "run this notebook from the top.")


def test_run_again_it_keeps_what_it_set_up(capsys) -> None:
    lesson.setup(gpus=2, model="T4")
    torch.ones(2, device="cuda:1")
    capsys.readouterr()
    lab = lesson.setup(gpus=2, model="T4")
    (line,) = said(capsys)
    assert line.startswith("devlab.lesson: 2 simulated GPUs set up earlier in this kernel. GPUs:")
    assert lab.gpus == [CUDA0, CUDA1]


def test_its_words_follow_the_lessons_cells(capsys) -> None:
    config.simulate_gpus(1)
    torch.ones(1, device="cuda:0")
    lesson.setup(gpus=3, cells={"gpus": "the cells of part 2"})
    assert "so the cells of part 2 will not run." in capsys.readouterr().out


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"gpus": 0}, "whole number of at least 1; got 0"),
    ({"gpus": True}, "got True"),
    ({"gpus": 2, "model": "T5"}, "no performance model for a GPU named 'T5'"),
    ({"gpus": 2, "memory_limit": -1}, "memory"),
    ({"gpus": 2, "cells": {"gpu": "x"}}, r"unknown keys \['gpu'\]; the keys are"),
])
def test_mistakes_are_named(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        lesson.setup(**kwargs)
    assert not simulated.is_active()


def test_it_says_whether_the_lessons_gpu_times_are_modeled(capsys) -> None:
    """`Lesson.times`, the first line of the cells that time GPUs: modeled on the lesson's GPU,
    or, simulated without a model, no GPU's time at all."""
    lab = lesson.setup(gpus=2, model="T4")
    assert lab.times == ("modeled on NVIDIA T4 (16 GB, PCIe) (from its specifications and "
                         "NCCL's tuning model, not measured)")
    assert simulated.model().full_name in lab.times
    config.stop_simulation()
    lab = lesson.setup(gpus=1, model="T4")  # one GPU: nothing passes between GPUs
    assert lab.times == "modeled on NVIDIA T4 (16 GB, PCIe) (from its specifications, not measured)"
    config.stop_simulation()
    lab = lesson.setup(gpus=2)
    assert simulated.is_active() and simulated.model() is None
    assert lab.times.startswith("simulated without a timing model: CPU time")
