"""What devlab knows of the machine: the CPU cores this process may use, the memory it can get."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devlab._helpers import host


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


def test_memory_available_is_the_machines_or_a_cgroups_smaller_room(tmp_path: Path) -> None:
    import psutil

    machine = psutil.virtual_memory().available
    assert abs(host.memory_available(tmp_path) - machine) < 2**30  # no cgroup files: the machine's
    (tmp_path / "memory.max").write_text("2147483648\n")  # Binder's 2 GB
    (tmp_path / "memory.current").write_text("536870912\n")
    assert host.memory_available(tmp_path) == min(2**31 - 2**29, psutil.virtual_memory().available)
    (tmp_path / "memory.max").write_text("max\n")
    assert abs(host.memory_available(tmp_path) - machine) < 2**30
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("1073741824\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text("1073741824\n")
    assert host.memory_available(v1) == 0
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{2**63 - 4096}\n")  # v1's "no limit"
    assert abs(host.memory_available(v1) - machine) < 2**30
