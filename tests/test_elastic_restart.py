"""torch elastic's restarts on simulated GPUs: a job whose rank fails in its first attempt
finishes in its second (issue 41; Note [A fresh bootstrap per attempt]). The job and its runner
are benchmarks/elastic_restart_stress.py's, which runs it many times and counts."""

from __future__ import annotations

from pathlib import Path

from benchmarks import elastic_restart_stress as stress


def test_a_job_restarted_by_torchrun_finishes_in_its_second_attempt(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(stress.JOB)
    # Rank 0 joins late in the restart, so its peer reads whatever the store holds for it
    # first: before each attempt bootstrapped afresh, the address of attempt 0's dead rank 0.
    result, out = stress.run_once(job, "nccl", simulate=True, timeout=400, delay=10.0)
    assert result == "2", out[-6000:]
    assert "finished: attempt 1 rank 0" in out and "finished: attempt 1 rank 1" in out, out
