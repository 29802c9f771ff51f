"""Launches that fork their ranks, over and over, three at once: how many hang?

Run: .venv/bin/python benchmarks/fork_stress.py [--runs N] [--timeout S] [--no-barrier] [--progress]
     .venv/bin/python benchmarks/fork_stress.py --resolver [--forks N]

Three workers run at once, each in its own process with two simulated GPUs, each launching one
kind of job N times in a row in that process (as a notebook's kernel would, cell after cell; a
job done first goes on until all are, so every run is made three at once):

- `lesson06`: lesson 06's training cell (accelerate's `notebook_launcher`, which starts torch
  elastic's agent here: its TCPStore server thread names every rank that connects);
- `accelerate`: accelerate's `notebook_launcher` with a function that only meets its peer;
- `lightning`: a Lightning `Trainer(strategy="ddp_notebook", devices=2)` fitting for one epoch.

A launch that has not ended after `--timeout` seconds counts as hung (the hang report,
`DEVLAB_HANG_TIMEOUT`, is set to the same bound, so a hung launch ends with the ranks' stacks
in the worker's log instead of blocking the rest). `--no-barrier` turns devlab's fork barrier
off, to count what it prevents. Prints, per job, the runs made, failed and hung, and the
median seconds per run (this machine's, under this very load: not a figure about any GPU).

`--resolver` shows the hazard itself, without torch: four threads resolve a name in a loop while
the process forks `--forks` children that each resolve once; a child that is still blocked
after 2 s inherited glibc's resolver lock held (glibc's fork does not reset it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = ("lesson06", "accelerate", "lightning")


def _lesson06(port: str, out: Path) -> None:
    import pickle

    import torch
    from accelerate import Accelerator, notebook_launcher
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from devlab.core import placement_log

    def make_model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))

    torch.manual_seed(1)
    X, y = torch.randn(64, 4), torch.randn(64, 1)

    def train(out: Path) -> None:  # lesson 06's cell, as it stands
        accelerator = Accelerator()
        rank = accelerator.process_index
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = DataLoader(TensorDataset(X, y), batch_size=16)
        model, opt, data = accelerator.prepare(model, opt, data)

        def step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            opt.step()
            return loss

        for epoch in range(10):
            for i, (xb, yb) in enumerate(data):
                if epoch == 0 and i == 0:
                    with placement_log.capture() as log:
                        loss = step(xb, yb)
                else:
                    loss = step(xb, yb)
        result = {"last loss": loss.item(), "log": log.records()}
        (out / f"rank{rank}.pkl").write_bytes(pickle.dumps(result))

    notebook_launcher(train, (out,), num_processes=2, use_port=port)
    for rank in range(2):
        pickle.loads((out / f"rank{rank}.pkl").read_bytes())


def _meet() -> None:
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    t = torch.ones(1, device=accelerator.device) * accelerator.process_index
    total = accelerator.reduce(t, reduction="sum")
    assert total.item() == 1.0, total


def _accelerate(port: str, out: Path) -> None:
    from accelerate import notebook_launcher

    notebook_launcher(_meet, (), num_processes=2, use_port=port)


def _lightning(port: str, out: Path) -> None:
    import lightning as L
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 1)

        def training_step(self, batch: list[torch.Tensor], i: int) -> torch.Tensor:
            xb, yb = batch
            return nn.functional.mse_loss(self.net(xb), yb)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
    os.environ["MASTER_PORT"] = port
    trainer = L.Trainer(accelerator="gpu", devices=2, strategy="ddp_notebook", max_epochs=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Model(), data)


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def worker(job: str, runs: int, timeout: float, barrier: bool, stop: Path | None) -> None:
    """Run one job `runs` times in this process, and on until `stop` exists when given (so the
    machine stays as loaded until the slowest job has made its runs); one JSON line per run."""
    import tempfile

    import devlab

    devlab.simulated.start(2)
    devlab.simulated.set_hang_timeout(timeout)
    if not barrier:
        _without_barrier()
    run = {"lesson06": _lesson06, "accelerate": _accelerate, "lightning": _lightning}[job]
    i = 0
    while i < runs or (stop is not None and not stop.exists()):
        out = Path(tempfile.mkdtemp())
        start = time.monotonic()
        try:
            run(_free_port(), out)
            outcome = "ok"
        except BaseException as e:  # noqa: BLE001 - counted, and the next run goes on
            outcome = f"failed: {type(e).__name__}: {str(e)[:200]}"
        seconds = time.monotonic() - start
        print(json.dumps({"job": job, "run": i, "outcome": outcome, "seconds": seconds,
                          "hung": seconds >= timeout}), flush=True)
        i += 1


def _without_barrier() -> None:
    """Release each child as soon as it is forked, as torch's start_processes does without
    devlab (the children still get the watchdog). Registered after devlab's own hook, this one
    runs after it in the parent."""
    from devlab.engine.simulated.torch_distributed.fork_safety import barrier

    def release_now() -> None:
        window = barrier._window
        if window is not None:
            os.write(window.write_fd, b"\0")
            window.forked -= 1  # so the window's end writes nothing for this child

    os.register_at_fork(after_in_parent=release_now)


def resolver(forks: int) -> None:
    import signal
    import socket

    stop = threading.Event()

    def resolve() -> None:
        while not stop.is_set():
            socket.getnameinfo(("127.0.0.1", 80), socket.NI_NUMERICSERV)

    threads = [threading.Thread(target=resolve, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    hung = 0
    start = time.monotonic()
    for _ in range(forks):
        pid = os.fork()
        if pid == 0:
            signal.alarm(2)
            socket.getnameinfo(("127.0.0.1", 80), socket.NI_NUMERICSERV)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        hung += os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM
    stop.set()
    print(f"{forks} forks while 4 threads resolve: {hung} children blocked in getnameinfo "
          f"(inherited glibc's resolver lock), {time.monotonic() - start:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each job (default 10)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds after which a run counts as hung (default 120)")
    parser.add_argument("--no-barrier", action="store_true", help="devlab's fork barrier off")
    parser.add_argument("--jobs", default=",".join(JOBS), help="comma-separated, of " + str(JOBS))
    parser.add_argument("--progress", action="store_true", help="print each run as it ends")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--stop-file", help=argparse.SUPPRESS)
    parser.add_argument("--resolver", action="store_true", help="the glibc hazard alone")
    parser.add_argument("--forks", type=int, default=1500, help="forks for --resolver")
    args = parser.parse_args()
    if args.resolver:
        resolver(args.forks)
        return
    if args.worker:
        worker(args.worker, args.runs, args.timeout, not args.no_barrier,
               Path(args.stop_file) if args.stop_file else None)
        return
    jobs = [j for j in args.jobs.split(",") if j]
    unknown = sorted(set(jobs) - set(JOBS))
    if unknown:
        parser.error(f"unknown jobs {unknown}: choose among {', '.join(JOBS)}")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONWARNINGS="ignore")
    env.pop("DEVLAB_SIMULATE_GPUS", None)
    logs = {job: open(Path(os.environ.get("TMPDIR", "/tmp")) / f"fork_stress_{job}.log", "w")
            for job in jobs}
    # Jobs that finish their runs first go on until every job has made its own, so that each
    # run of each job is made three at once.
    stop = Path(tempfile.mkdtemp()) / "stop"
    procs = {job: subprocess.Popen(
        [sys.executable, __file__, "--worker", job, "--runs", str(args.runs), "--timeout",
         str(args.timeout), "--stop-file", str(stop)] + (["--no-barrier"] if args.no_barrier else []),
        stdout=subprocess.PIPE, stderr=logs[job], text=True, env=env) for job in jobs}
    results: dict[str, list[dict]] = {job: [] for job in jobs}

    printing = threading.Lock()

    def read(job: str) -> None:
        for line in procs[job].stdout:  # type: ignore[union-attr]
            if line.startswith("{"):
                results[job].append(json.loads(line))
                if all(len(results[j]) >= args.runs for j in jobs):
                    stop.touch()
                if args.progress:  # a long stress can be read (or stopped) part way
                    with printing:  # one reader thread per job: whole lines only
                        print(line.strip(), flush=True)

    readers = [threading.Thread(target=read, args=(job,)) for job in jobs]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    for job in jobs:
        procs[job].wait()
        logs[job].close()
    print(f"barrier {'off' if args.no_barrier else 'on'}, {len(jobs)} jobs at once on "
          f"{os.cpu_count()} cores, hang bound {args.timeout:g} s")
    for job in jobs:
        rs = results[job]
        failed = [r for r in rs if r["outcome"] != "ok" and not r["hung"]]
        hung = [r for r in rs if r["hung"]]
        median = statistics.median(r["seconds"] for r in rs) if rs else float("nan")
        print(f"  {job:10s} runs {len(rs):4d}  ok {len(rs) - len(failed) - len(hung):4d}  "
              f"failed {len(failed):3d}  hung {len(hung):3d}  median {median:.1f} s/run")
        for r in (failed + hung)[:3]:
            print(f"      run {r['run']}: {r['outcome']}")


if __name__ == "__main__":
    main()
