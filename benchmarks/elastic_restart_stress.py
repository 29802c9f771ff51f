"""An elastic job whose rank 1 fails in its first attempt: does every run come back in its second?

Run: .venv/bin/python benchmarks/elastic_restart_stress.py [--runs N] [--backend nccl|gloo]
     [--launcher torchrun|elastic_launch|notebook_launcher] [--no-simulation] [--timeout S]
     [--delay S] [--show]

Each run launches two ranks with two restarts allowed: by default
`python -m torch.distributed.run --nproc-per-node 2 --max-restarts 2 job.py`; `--launcher
elastic_launch` calls torch.distributed.launcher.api's `elastic_launch` on `job` (its own
start method, spawn), `--launcher notebook_launcher` accelerate's `notebook_launcher(job,
max_restarts=2)` (which forks its ranks). Every attempt of each rank runs init_process_group,
one all_reduce and a barrier (`job`); rank 1 raises in attempt 0, after its all_reduce. A run
should finish in attempt 1 (the second). `--delay S`
has rank 0 wait S seconds before it joins the group again in a restart, which makes a stale
bootstrap key of the attempt before (Note [A fresh bootstrap per attempt], in
devlab/engine/simulated/torch_distributed/nccl.py) the one its peer reads, every time. By default the
job runs on 2 simulated GPUs (DEVLAB_SIMULATE_GPUS=2, backend "nccl", which devlab carries on
gloo); `--no-simulation --backend gloo` runs torch alone, the reproduction for torch's own
report (docs/upstream-gloo-restart.md). Prints, per run, the attempts it took (or "hung" past
the timeout, or "failed" when its restarts ran out), then the counts and the seconds (this
machine's, under its load: not a figure about any GPU).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MONITOR_INTERVAL = 0.1  # seconds between the elastic agent's looks at its ranks


def job(backend: str = "nccl") -> int:
    """One attempt of one rank (torch elastic's environment tells which): rank 1 fails in
    attempt 0; every other one finishes, says so, and returns its rank."""
    import torch
    import torch.distributed as dist

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])
    if attempt > 0 and rank == 0:  # a rank that restarts slowly (it loads its data, say)
        time.sleep(float(os.environ.get("RANK0_RESTART_DELAY", "0")))
    dist.init_process_group(backend)
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else "cpu"
    t = torch.ones(1, device=device)
    dist.all_reduce(t)
    assert t.item() == dist.get_world_size()
    if attempt == 0 and rank == 1:
        raise RuntimeError("rank 1 fails in attempt 0, as planned")
    dist.barrier()
    print(f"finished: attempt {attempt} rank {rank}", flush=True)
    dist.destroy_process_group()
    return rank


# torchrun's script: the job, imported from here (run_once puts this checkout on the path).
JOB = "import sys\nfrom benchmarks.elastic_restart_stress import job\njob(sys.argv[1])\n"

# The launchers that are functions: each program gets the backend as its one argument.
PROGRAMS = {
    "elastic_launch": f"""\
import sys
from torch.distributed.launcher.api import LaunchConfig, elastic_launch
from benchmarks.elastic_restart_stress import job
config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="restart",
                      rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=2,
                      monitor_interval={MONITOR_INTERVAL})
print("returned", elastic_launch(config, job)(sys.argv[1]), flush=True)
""",
    "notebook_launcher": f"""\
import socket, sys
from accelerate import notebook_launcher
from benchmarks.elastic_restart_stress import job
with socket.socket() as s:  # a free port, not accelerate's fixed 29500
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
notebook_launcher(job, (sys.argv[1],), num_processes=2, max_restarts=2,
                  monitor_interval={MONITOR_INTERVAL}, use_port=str(port))
print("returned", flush=True)
""",
}
LAUNCHERS = ("torchrun", *PROGRAMS)


def run_once(job: Path, backend: str, simulate: bool, timeout: float, delay: float = 0.0,
             launcher: str = "torchrun") -> tuple[str, str]:
    """One job: ("2" for the attempts it took, "hung" or "failed"), and its output. `job`:
    torchrun's script (JOB), `delay`: seconds rank 0 waits before it joins the group again in
    a restart; `launcher`: one of LAUNCHERS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVLAB_")}
    env["RANK0_RESTART_DELAY"] = str(delay)
    env["PYTHONPATH"] = str(ROOT)
    env["OMP_NUM_THREADS"] = "1"
    if simulate:
        env["DEVLAB_SIMULATE_GPUS"] = "2"
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--max-restarts", "2", "--monitor-interval", str(MONITOR_INTERVAL), str(job),
               backend]
    else:
        cmd = [sys.executable, "-c", PROGRAMS[launcher], backend]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM: torchrun stops its workers (each in a session of its own) before it exits
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        return "hung", out
    attempts = {int(a) for a in re.findall(r"finished: attempt (\d+) rank \d+", out)}
    if proc.returncode != 0 or not attempts:
        return "failed", out
    return str(max(attempts) + 1), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--backend", default=None, help="nccl (default when simulating), gloo")
    parser.add_argument("--launcher", default="torchrun", choices=LAUNCHERS)
    parser.add_argument("--no-simulation", action="store_true", help="torch alone")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds a run may take")
    parser.add_argument("--delay", type=float, default=0.0,
                        help="seconds rank 0 waits before it joins again in a restart")
    parser.add_argument("--show", action="store_true", help="print each odd run's output")
    args = parser.parse_args()
    simulate = not args.no_simulation
    backend = args.backend or ("nccl" if simulate else "gloo")
    counts: collections.Counter[str] = collections.Counter()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.py"
        job.write_text(JOB)
        for i in range(args.runs):
            t0 = time.perf_counter()
            result, out = run_once(job, backend, simulate, args.timeout, args.delay,
                                   args.launcher)
            counts[result] += 1
            print(f"run {i + 1}: {result} ({time.perf_counter() - t0:.1f} s)", flush=True)
            if args.show and result != "2":
                print(out[-4000:], flush=True)
    print(f"{args.launcher}, {'simulated' if simulate else 'torch alone'}, backend {backend}, "
          f"delay {args.delay} s: "
          f"{args.runs} runs, "
          + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
          + f"; {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
