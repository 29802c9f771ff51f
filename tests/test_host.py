"""What devlab knows of the machine: the CPU cores this process may use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devlab import host


def test_a_cgroup_v2_quota_counts_whole_cpus(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert host.cpu_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert host.cpu_quota(tmp_path) is None


def test_a_cgroup_v1_quota_and_none(tmp_path: Path) -> None:
    assert host.cpu_quota(tmp_path) is None  # no cgroup files at all
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert host.cpu_quota(tmp_path) == 0.5
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert host.cpu_quota(tmp_path) is None
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("garbage\n")
    assert host.cpu_quota(tmp_path) is None


@pytest.mark.parametrize(("quota", "expected"), [(None, 64), (0.5, 1), (1.0, 1), (2.5, 3), (100.0, 64)])
def test_cores_are_the_affinity_capped_by_the_quota(monkeypatch, quota, expected) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(host, "cpu_quota", lambda: quota)
    assert host.cpu_cores() == expected
