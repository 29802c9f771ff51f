"""Programs written for real GPUs, unmodified, on simulated GPUs in every process they start:
the start-up hook pip installs, `python -m devlab run`, torch.multiprocessing.spawn, torchrun
on one "node" and on two. Each runs against devlab installed by pip in a fresh environment."""

from __future__ import annotations

import ast
import importlib.util
import re
import socket
import subprocess
from pathlib import Path

import pytest
import torch
from installed import PTH, env, make_venv, site_packages
from torch import nn

SCRIPTS = Path(__file__).resolve().parent / "distributed"
DDP_SCRIPT = SCRIPTS / "ddp_real_gpus.py"
TIMEOUT = 300


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> Path:
    """The python of a fresh environment where pip installed devlab (a regular install)."""
    return make_venv(tmp_path_factory.mktemp("regular"))


def _cwd(cmd: list[str]) -> Path:
    """The environment's own folder: `python -c` searches the working directory first, and a
    checkout there would shadow the installed devlab."""
    return Path(cmd[0]).parents[1]


def _run(cmd: list[str], **extra: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env(**extra), timeout=TIMEOUT,
                          cwd=_cwd(cmd))
    assert done.returncode == 0, f"{cmd}\n{done.stdout}\n{done.stderr}"
    return done


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


# --- the start-up hook -------------------------------------------------------------------------

@pytest.mark.parametrize("editable", [False, True], ids=["pip install", "pip install -e"])
def test_pip_installs_the_start_up_hook(tmp_path, editable: bool) -> None:
    python = make_venv(tmp_path, editable)
    assert (site_packages(python) / PTH).read_text().startswith("import os, sys;")
    without = _run([str(python), "-c", "import sys; print(sorted(m for m in sys.modules "
                                        "if m.startswith(('torch', 'devlab', '_devlab'))))"])
    assert without.stdout.strip() == "[]"  # without the variable, nothing more is imported
    code = ("import sys; print('devlab' in sys.modules); import torch; "
            "print(torch.cuda.device_count(), torch.cuda.get_device_name(1), 'devlab' in sys.modules)")
    done = _run([str(python), "-c", code], DEVLAB_SIMULATE_GPUS="2")
    assert done.stdout.split("\n")[:2] == ["False", "2 Simulated GPU (CPU-backed) True"]
    plain = _run([str(python), "-c", "import torch; print(torch.cuda.device_count())"])
    assert plain.stdout.strip() == "0"
    # Set by the program itself before torch is imported (issue 41), and under -I and -E,
    # which leave site-packages' .pth lines (and DEVLAB_*) as they are.
    inside = ("import os; os.environ['DEVLAB_SIMULATE_GPUS'] = '2'; import torch; "
              "print(torch.cuda.device_count())")
    for flags in ([], ["-I"], ["-E"]):
        done = _run([str(python), *flags, "-c", inside])
        assert done.stdout.strip() == "2", (flags, done.stdout, done.stderr)


def test_every_process_a_program_starts_sees_the_gpus(python: Path) -> None:
    done = _run([str(python), str(SCRIPTS / "children.py")], DEVLAB_SIMULATE_GPUS="2")
    seen = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert seen == {"parent": 2, "multiprocessing fork": 2, "multiprocessing spawn": 2,
                    "multiprocessing forkserver": 2, "torch.multiprocessing.spawn": 2,
                    "DataLoader worker (spawn)": 2}


def test_a_broken_devlab_is_reported_in_one_line_and_the_program_runs_on(tmp_path, python) -> None:
    shadow = tmp_path / "devlab"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('broken on purpose')\n")
    code = "import torch; print(torch.cuda.device_count())"
    done = _run([str(python), "-c", code], DEVLAB_SIMULATE_GPUS="2", PYTHONPATH=str(tmp_path))
    assert done.stdout.strip() == "0"
    assert done.stderr.strip() == ("devlab: DEVLAB_SIMULATE_GPUS is set, but devlab could not "
                                   "start its simulated GPUs: ImportError: broken on purpose")


# --- the command line -------------------------------------------------------------------------

def test_the_command_line_says_what_is_simulated(python: Path) -> None:
    devlab = python.parent / "devlab"
    for cmd in ([str(python), "-m", "devlab", "run", "--help"], [str(devlab), "run", "--help"]):
        text = _run(cmd).stdout
        assert "simulated GPUs" in text and "computed on the CPU" in text
        assert "runs on gloo" in text and "Speed says nothing about a real" in text
    bad = subprocess.run([str(python), "-m", "devlab", "run", "x.py"], capture_output=True,
                         text=True, env=env(), timeout=TIMEOUT, cwd=_cwd([str(python)]))
    assert bad.returncode == 2 and "--simulate-gpus N" in bad.stderr


# --- DDP scripts written for real GPUs ------------------------------------------------------

def _reference() -> list[float]:
    """The script's model trained in one process on the whole batch, on the CPU: what DDP on
    any number of ranks (equal shares of the batch) computes."""
    spec = importlib.util.spec_from_file_location("ddp_real_gpus", DDP_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    net = script.model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    X, y = script.data()
    for _ in range(script.STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(net(X), y).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in net.parameters()]).tolist()


def _ranks(stdout: str, world: int, gpus: int) -> None:
    """Every rank trained on its own GPU and ended with the one-process weights."""
    # Two processes write to one pipe: their lines may interleave, so each line is matched
    # wherever it is.
    found = sorted(re.finditer(r"rank (\d+) on (\S+) of (\d+) GPUs backend (\w+) weights (\[[^\]]*\])",
                               stdout), key=lambda m: int(m[1]))
    assert [int(m[1]) for m in found] == list(range(world)), stdout
    reference = torch.tensor(_reference())
    for rank, m in enumerate(found):
        assert m[3] == str(gpus) and m[4] == "nccl"
        assert m[2] == f"cuda:{rank % gpus}"
        torch.testing.assert_close(torch.tensor(ast.literal_eval(m[5])), reference)


def test_a_real_gpu_script_started_with_mp_spawn(python: Path, tmp_path) -> None:
    done = _run([str(python), str(DDP_SCRIPT), str(tmp_path / "ckpt.pt")],
                DEVLAB_SIMULATE_GPUS="2", MASTER_PORT=str(_free_port()))
    _ranks(done.stdout, world=2, gpus=2)
    notices = [line for line in done.stderr.splitlines() if "no NCCL" in line]
    assert len(notices) == 2, done.stderr  # once in each rank


def test_torchrun_standalone_under_devlab_run(python: Path, tmp_path) -> None:
    done = _run([str(python), "-m", "devlab", "run", "--simulate-gpus", "2",
                 "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                 str(DDP_SCRIPT), str(tmp_path / "ckpt.pt")])
    _ranks(done.stdout, world=2, gpus=2)


def test_torchrun_on_two_nodes_with_c10d_rendezvous(python: Path, tmp_path) -> None:
    """Two torchrun agents on localhost, one process each, each node with one simulated GPU."""
    endpoint = f"localhost:{_free_port()}"
    cmd = [str(python), "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "devlab-test",
           str(DDP_SCRIPT), str(tmp_path / "ckpt.pt")]
    nodes = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env(DEVLAB_SIMULATE_GPUS="1"), cwd=_cwd(cmd))
             for _ in range(2)]
    outputs = [node.communicate(timeout=TIMEOUT) for node in nodes]
    for node, (out, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, f"{out}\n{err}"
    _ranks("".join(out for out, _ in outputs), world=2, gpus=1)
