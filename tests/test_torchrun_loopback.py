"""torchrun started on simulated GPUs, the two ways the README shows, listens on loopback only.

torch's elastic agent makes two TCPStores (the rendezvous store and the workers' store) that
bind every interface whatever host they are given. Each rank here, while every rank and the
agent are up, lists the agent's listeners and its own, and connects to each through the
machine's address beyond loopback: all must be refused. Run also with the hostname set (in a
UTS namespace) to the machine's outside address, as on Binder and Colab, where the workers'
store is made at the machine's name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "distributed"))
import hygiene  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

RANK = """
import json, os, sys
sys.path.insert(0, {tests!r})
import hygiene, torch, torch.distributed as dist

dist.init_process_group("nccl")
dist.barrier()  # every rank's listeners are up
agent = os.getppid()
ports = sorted({{p for _, p in hygiene.listeners(agent) + hygiene.listeners()}})
outside = hygiene.beyond_loopback()
seen = {{"rank": dist.get_rank(), "master_addr": os.environ["MASTER_ADDR"],
        "agent": hygiene.listeners(agent), "mine": hygiene.listeners(),
        "refused": [hygiene.refused(outside, p) for p in ports] if outside else None,
        "device": str(torch.ones(1, device=dist.get_rank()).device)}}
dist.barrier()  # every rank has looked before any leaves
with open(f"seen{{dist.get_rank()}}.json", "w") as f:  # (torchrun interleaves the ranks' lines)
    json.dump(seen, f)
dist.destroy_process_group()
"""

TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
WAYS = {
    "devlab run": lambda script: ([sys.executable, "-m", "devlab", "run", "--simulate-gpus", "2",
                                   *TORCHRUN, script], {}),
    "the start-up hook": lambda script: ([sys.executable, *TORCHRUN, script],
                                         {"DEVLAB_SIMULATE_GPUS": "2"}),
}


def run(tmp_path: Path, way: str, hostname: str | None = None) -> list[dict]:
    script = tmp_path / "rank.py"
    script.write_text(RANK.format(tests=str(Path(__file__).parent / "distributed")))
    argv, extra = WAYS[way](str(script))
    if hostname is not None:
        argv = ["unshare", "--uts", "sh", "-c", f'hostname {hostname} && exec "$@"', "sh", *argv]
    env = {**os.environ, **extra, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    if hostname is not None and done.returncode and "unshare" in done.stderr:
        pytest.skip(f"cannot make a UTS namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stdout + done.stderr
    seen = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("seen*.json"))]
    assert sorted(s["rank"] for s in seen) == [0, 1], done.stdout + done.stderr
    return seen


def check(seen: list[dict]) -> None:
    for rank in seen:
        assert rank["device"] == f"cuda:{rank['rank']}"  # the simulation is on in the ranks
        # the agent's two stores, each rank's gloo
        assert len(rank["agent"]) >= 2 and rank["mine"], rank
        assert all(hygiene.is_loopback(a) for a, _ in rank["agent"] + rank["mine"]), rank
        assert hygiene.is_loopback(rank["master_addr"]), rank
        if rank["refused"] is not None:
            assert rank["refused"] and all(rank["refused"]), rank


@pytest.mark.parametrize("way", sorted(WAYS))
def test_torchrun_standalone_on_simulated_gpus_listens_on_loopback_only(tmp_path, way) -> None:
    check(run(tmp_path, way))


def test_also_where_the_machines_name_resolves_beyond_loopback(tmp_path) -> None:
    outside = hygiene.beyond_loopback()
    if outside is None:
        pytest.skip("this machine has no address beyond loopback")
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root to give a process its own hostname")
    check(run(tmp_path, "devlab run", hostname=outside))
