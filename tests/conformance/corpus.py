"""The conformance corpus: real third-party PyTorch programs, kept byte for byte.

Each `Program` names where its files come from (repository, path, commit of the stored copy,
its length and our copy's SHA-256), its licence, how to run it (entry file and argv, run from a
temporary copy of its folder), what it exercises, the data stand-in it needs (or none), and how
its simulated run is judged: numbers taken from stdout and compared with the same program on the
CPU (`compare`), or why no comparison is possible (`compare_note`), lines the simulated run must
print (`expect_stdout`), an error the program itself raises on a real GPU too (`expect_error`),
how many simulated GPUs must have held its tensors (`gpus_used`), and for a notebook the code
cells whose outputs must equal those the notebook stores from its author's GPU run. A program
that runs as several processes, one per rank, says so in `ranks` (what its ranks must agree on,
and how its CPU run is replayed or compared). One that a launcher starts gives the launcher's
command line as its users type it before the script (`launch`: torchrun, Lightning's `fabric
run`, `accelerate launch`); environment settings the program or its framework reads are in
`env`; one run as a notebook user runs it, in a real Jupyter kernel, says so (`kernel`).

A program from an installed package (torchtitan) has no files of its own: it names its module
(`module`, run with `-m`, as its users run it) and the package the `test` extra pins
(`package`). One that needs more than the corpus's two simulated GPUs says how many its machine
has (`machine_gpus`); one that refuses to run on a CPU is compared with another run of itself on
`reference_gpus` simulated GPUs with its reference settings (`cpu_argv`, `cpu_launch`, ...),
where a simulated GPU computes with the CPU's own kernels.

`programs/<name>/` holds the files; `standins/` the torchvision stand-in (and
`standins-torchmetrics/` the names torchmetrics imports from `torchvision.models`); `datagen.py`
the data files a program reads; `observer/` what the runner watches in a program's rank
processes; `references.py` the CPU replays; `run_program.py` runs one program.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import datagen

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
STANDINS = HERE / "standins"

BSD3_TUTORIALS = "BSD-3-Clause (pytorch/tutorials LICENSE, © 2017-2022 PyTorch contributors)"
BSD3_EXAMPLES = "BSD-3-Clause (pytorch/examples LICENSE, © 2017 PyTorch contributors)"
MIT_NANOGPT = "MIT (karpathy/nanoGPT LICENSE, © 2022 Andrej Karpathy)"
MIT_LLMS = "MIT (rasbt/LLMs-from-scratch LICENSE.txt, © 2023-2024 Sebastian Raschka)"
APACHE_LIGHTNING = ("Apache-2.0 (Lightning-AI/pytorch-lightning LICENSE, © 2018-2021 William "
                    "Falcon)")
APACHE_ACCELERATE = ("Apache-2.0 (huggingface/accelerate LICENSE; each file's header: © 2022 or "
                     "2023 The HuggingFace Team)")
APACHE_LLMS = ("Apache-2.0 (the file's header: 'Copyright (c) Sebastian Raschka under Apache License "
               "2.0 (see LICENSE.txt)'; rasbt/LLMs-from-scratch LICENSE.txt @b655e628)")

TORCHVISION_MNIST = (
    "torchvision stand-in (tests/conformance/standins/torchvision): datasets.MNIST gives synthetic "
    "28x28 uint8 grey PIL images with int labels 0-9, 1280 train / 400 test samples (the real set: "
    "60000 / 10000); transforms.ToTensor/Normalize/Compose as torchvision's"
)
TORCHVISION_FASHION = TORCHVISION_MNIST.replace("datasets.MNIST", "datasets.FashionMNIST")
TORCHVISION_IMPORT_ONLY = (
    "torchvision stand-in (tests/conformance/standins/torchvision): imported, no dataset used"
)

FLOAT = r"-?\d+\.\d+(?:e[-+]?\d+)?"


@dataclass(frozen=True)
class SourceFile:
    """One stored file: its repository path and commit, our copy's name, length and digest.
    `excerpt`: the copy is one literal block of that file (an example of a document), found
    after the line quoted here, byte for byte."""

    path: str
    commit: str
    local: str
    chars: int
    sha256: str
    excerpt: str | None = None


@dataclass(frozen=True)
class Compare:
    """Numbers a run prints: every group of every match of `pattern` (multiline) in stdout,
    taken from the first line matching `after` (if given) up to the first line matching
    `until` (if given). With `by_process` (a pattern whose first group names the process that
    printed a line, as `[GPU0]`), the lines are first put in the order of that name, each
    process's lines in their own order: processes that share stdout interleave their lines in
    any order. Two runs agree when both lists have the same length (> 0) and each pair is
    within `rtol`/`atol`."""

    pattern: str
    rtol: float = 0.0
    atol: float = 0.0
    after: str | None = None
    until: str | None = None
    by_process: str | None = None


@dataclass(frozen=True)
class Ranks:
    """A program that runs as `world` processes, one per rank and simulated GPU (started by
    `torch.multiprocessing.spawn` or torchrun), each training a DDP replica. The runner's observer
    (`observer/sitecustomize.py`) records in every rank process its rank, the parameters before
    its first optimizer step and after its last, and its GPU's peak bytes. The ranks must all
    have stepped, each on its own GPU (`cuda:<rank>`), start from the same parameters (DDP
    broadcasts rank 0's, though each process drew its own) and end with the same ones (DDP
    averages gradients with an all-reduce: every rank applies the same step).

    `checkpoint`: a file rank 0 saves (a glob pattern; the state_dict, or `checkpoint_key` in
    the dict saved), which must hold rank 0's final parameters. `unchanged`: the final parameters
    must equal the initial ones (a loss whose gradient is 0 whatever the data). `replay`: the
    function in `references.py` that is this program's CPU run: it replays the training on the
    CPU in one process, from the seed the program gives its ranks or else from rank 0's recorded
    initial parameters, prints the lines the program prints, and its initial and final
    parameters must equal rank 0's within `rtol`/`atol`.

    `trains=False`: a program whose ranks check themselves (a framework's own test script, its
    assertions the check) and need not step an optimizer; each rank, known by the RANK its
    launcher gave it, must still have held tensors on its own GPU."""

    world: int = 2
    checkpoint: str | None = None
    checkpoint_key: str | None = None
    unchanged: bool = False
    replay: str | None = None
    rtol: float = 1e-5
    atol: float = 1e-6
    trains: bool = True


@dataclass(frozen=True)
class Program:
    """One corpus entry (see the module docstring).

    `launch`: the command that starts the program, as its users type it before the script (a
    console script and its arguments: `("torchrun", "--standalone", "--nproc-per-node", "2")`,
    `("accelerate", "launch", "--multi_gpu", ...)`); `cpu_launch` for the CPU run if it differs.
    `env`: environment settings the program or its framework reads (`PL_TRAINER_DEVICES`, ...),
    `cpu_env` for the CPU run if they differ. `kernel`: run as a notebook user runs it, in a
    real Jupyter kernel: a notebook's code cells (but `skip_cells`, code-cell indices, which
    install packages or fetch files from the internet), or a script's text as one cell, or, with
    `cells`, the script loaded as a module (`%run -n`, which does not run its `__main__` block)
    and then `cells`, which call what that block would (to leave out a part of the program).
    `standins`: the folders (under tests/conformance) put on the import path. A document's
    examples (PyTorch's notes) are a program of excerpts (`SourceFile.excerpt`): the runner
    writes `prelude` (what the examples assume is defined: a `loss`, a `Network`), then each
    excerpt's code followed by its `steps` entry (the runner's lines printing what the document
    says of the example: a tensor's device, a gradient), with each line of pseudo-code in
    `pseudo` (`use grads`) replaced by the Python given for it. `own_network`: the
    program listens on fixed TCP ports (its own or its launcher's default); where the machine
    allows it, the run gets a network namespace of its own (loopback only), so that two runs at
    once cannot take each other's ports. `rst_blocks`: a reStructuredText tutorial whose program
    is its first that many python blocks (its later ones show variants of the program's lines).
    """

    name: str
    title: str
    repo: str
    files: tuple[SourceFile, ...]
    licence: str
    entry: str
    exercises: str
    argv: tuple[str, ...] = ()
    cpu_argv: tuple[str, ...] | None = None
    standin: str = "none"
    data: str | None = None
    compare: Compare | None = None
    compare_note: str = ""
    expect_stdout: tuple[str, ...] = ()
    expect_error: str | None = None
    expect_error_at: str | None = None
    gpus_used: int = 1
    notebook_cells: tuple[int, ...] = ()
    timeout: float = 240.0
    notes: str = ""
    launch: tuple[str, ...] = ()
    cpu_launch: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    cpu_env: tuple[tuple[str, str], ...] | None = None
    kernel: bool = False
    skip_cells: tuple[int, ...] = ()
    cells: tuple[str, ...] = ()
    standins: tuple[str, ...] = ("standins",)
    own_network: bool = False
    ranks: Ranks | None = None
    module: str | None = None
    package: str | None = None
    machine_gpus: int = 2
    reference_gpus: int = 0
    rst_blocks: int = 0
    prelude: str = ""
    steps: tuple[str, ...] = ()
    pseudo: tuple[tuple[str, str], ...] = ()
    # Another program whose stored files this one runs (the same script, launched otherwise).
    files_of: str = ""
    # A second launch in the same folder after the first ended well, with these arguments added
    # to the first's (own or cpu_*): a run that resumes from a checkpoint the first saved part
    # way. It must print the numbers (`compare`) the first printed from that point on, and its
    # ranks end with the first launch's final parameters (see run_program.relaunch_problems).
    relaunch: tuple[str, ...] = ()

    @property
    def folder(self) -> Path:
        return PROGRAMS / (self.files_of or self.name)

    @property
    def reference(self) -> str:
        """What the simulated run is compared with: 'the CPU' or the reference run's GPUs."""
        return (f"{self.reference_gpus} simulated GPU{'s' * (self.reference_gpus > 1)}"
                if self.reference_gpus else "the CPU")

    @property
    def is_notebook(self) -> bool:
        return self.entry.endswith(".ipynb")

    @property
    def replays(self) -> bool:
        """Whether the CPU run is a replay of the simulated run (see Ranks)."""
        return self.ranks is not None and self.ranks.replay is not None

    def source_line(self) -> str:
        """'repo: path@commit, ...' (or the installed package's module) for tables."""
        if self.module:
            return f"{self.repo}: `python -m {self.module}` from {self.package}"
        return f"{self.repo}: " + ", ".join(f"{f.path}@{f.commit[:10]}" for f in self.files)


# torchrun on one machine, two ranks, as the programs' own instructions start them.
TORCHRUN_2 = ("torchrun", "--standalone", "--nproc-per-node", "2")
TUTORIALS = "pytorch/tutorials"
EXAMPLES = "pytorch/examples"
# The DDP tutorial series' data helper, read by each of its programs.
DDP_SERIES_DATAUTILS = SourceFile(
    "distributed/ddp-tutorial-series/datautils.py", "a7e31a5df144e014866521dc97c0c1fb259b24ec",
    "datautils.py", 693, "21681fe4c9bc6e844e9624da832cfd896b812772553957cf9bd6cc150fa4fce3")

CORPUS: tuple[Program, ...] = (
    Program(
        name="quickstart_tutorial",
        title="PyTorch Quickstart (Learn the Basics)",
        repo=TUTORIALS,
        files=(SourceFile("beginner_source/basics/quickstart_tutorial.py",
                          "afcd669d56554c2ef46f2da92edbfaf8c54043ec", "quickstart_tutorial.py",
                          8550, "73d1ca9b46151693395a01537bc088b89036057d6a04405f76ebeb4816f2f2f9"),),
        licence=BSD3_TUTORIALS,
        entry="quickstart_tutorial.py",
        exercises="device selection (`'cuda' if torch.cuda.is_available()`), `Module.to`, moving "
                  "batches, SGD training loop, `.item()`, `torch.save(state_dict)` of GPU tensors "
                  "and `torch.load(weights_only=True)` back onto the GPU",
        standin=TORCHVISION_FASHION,
        compare=Compare(rf"(?:loss: |Accuracy: |Avg loss: )\s*({FLOAT})", rtol=1e-4, atol=2e-6),
        expect_stdout=(r"^Using cuda device$", r"^Predicted: \"",),
    ),
    Program(
        name="tensorqs_tutorial",
        title="Tensors (Learn the Basics)",
        repo=TUTORIALS,
        files=(SourceFile("beginner_source/basics/tensorqs_tutorial.py",
                          "7a5420a2093171a4560d25d4a19d95aa0ae6d8c7", "tensorqs_tutorial.py",
                          7668, "5e0150f9ff6beb8d4c9a7b9686d53773cd0d416d75fa35e4a9c31373827880b3"),),
        licence=BSD3_TUTORIALS,
        entry="tensorqs_tutorial.py",
        exercises="`tensor.to(\"cuda\")` after `torch.cuda.is_available()`, tensor creation, "
                  "indexing, matmul with `out=`, NumPy bridge of CPU tensors",
        compare=Compare(FLOAT),
    ),
    Program(
        name="buildmodel_tutorial",
        title="Build the Neural Network (Learn the Basics)",
        repo=TUTORIALS,
        files=(SourceFile("beginner_source/basics/buildmodel_tutorial.py",
                          "c53e7d4efc0e39e455c531d21ec7db28ba220214", "buildmodel_tutorial.py",
                          7453, "3848002404239acb7555f3ae26959c680c39be463803eaa6c2dc43b92983e2f4"),),
        licence=BSD3_TUTORIALS,
        entry="buildmodel_tutorial.py",
        exercises="`torch.rand(..., device=device)`, model on the GPU, printing GPU parameters "
                  "and predictions (host syncs), CPU layers beside GPU ones",
        standin=TORCHVISION_IMPORT_ONLY,
        compare=Compare(FLOAT, rtol=1e-5, atol=1e-6, after=r"^Model structure:"),
        compare_note="only the parameters printed at the end (drawn on the CPU before any GPU "
                     "random number): on a GPU, `torch.rand(..., device='cuda')` draws from the "
                     "CUDA generator, so the CPU randoms printed after it legitimately differ "
                     "from a CPU run",
        expect_stdout=(r"^Using cuda device$", r"Predicted class: tensor\(\[\d\], device='cuda:0'\)",
                       r"Values : tensor\(.*device='cuda:0'"),
    ),
    Program(
        name="blitz_tensor_tutorial",
        title="What is PyTorch? (60 Minute Blitz, tensors)",
        repo=TUTORIALS,
        files=(SourceFile("beginner_source/blitz/tensor_tutorial.py",
                          "1dc0de7f777e3aac6c073db3f710f6f735923762", "tensor_tutorial.py",
                          5154, "ec63fa8d76d973360cef476ad7cc574927d71836b6af55720edaf0532782cdee"),),
        licence=BSD3_TUTORIALS,
        entry="tensor_tutorial.py",
        exercises="\"CUDA Tensors\": `torch.ones_like(x, device=device)`, `x.to(device)`, "
                  "GPU add, `z.to(\"cpu\", torch.double)`",
        compare=Compare(FLOAT, after=r"^tensor\(\[\[0, 0, 0\],", until=r"device='cuda"),
        compare_note="the first print shows `torch.empty` (uninitialized memory) and is skipped; "
                     "the CUDA section prints only on the GPU run",
        expect_stdout=(rf"^tensor\(\[{FLOAT}\], device='cuda:0'\)$",
                       rf"^tensor\(\[{FLOAT}\], dtype=torch.float64\)$"),
    ),
    Program(
        name="save_load_across_devices",
        title="Saving and loading models across devices (recipe)",
        repo=TUTORIALS,
        files=(SourceFile("recipes_source/recipes/save_load_across_devices.py",
                          "1faab41b059aa60b24164a042ffde043fe8316db", "save_load_across_devices.py",
                          5305, "cb38e2c93b441998e3de6819ed23f9d1873bc8ddba481f535d78c7342f542da2"),),
        licence=BSD3_TUTORIALS,
        entry="save_load_across_devices.py",
        exercises="`torch.save`/`torch.load` with `map_location=torch.device('cpu')` and "
                  "`map_location=\"cuda:0\"`, `load_state_dict` then `model.to(torch.device('cuda'))`",
        compare_note="no CPU run: the recipe hard-codes `torch.device(\"cuda\")`",
        expect_error=r"^AttributeError: 'Net' object has no attribute 'module'$",
        expect_error_at="save_load_across_devices.py:173",
        notes="The recipe's own last step saves `net.module.state_dict()` of a model never wrapped "
              "in DataParallel, so it ends with this AttributeError on a real GPU too, after every "
              "device step above it ran.",
    ),
    Program(
        name="changing_default_device",
        title="Changing default device (recipe)",
        repo=TUTORIALS,
        files=(SourceFile("recipes_source/recipes/changing_default_device.py",
                          "0a659232c0d83868b55cdd02c4d9363f8a4b862e", "changing_default_device.py",
                          1409, "41dd11186329835ce6544f38b905c055fa74955c31f0c88e4a0ef117c6820f1b"),),
        licence=BSD3_TUTORIALS,
        entry="changing_default_device.py",
        exercises="`with torch.device('cuda'):` and `torch.set_default_device('cuda')` for module "
                  "construction and factories",
        compare_note="no CPU run: the recipe uses `torch.device('cuda')` unconditionally; its "
                     "whole output is checked instead",
        expect_stdout=(r"\Acpu\ncuda:0\ncuda:0\ncuda:0\ncuda:0\n\Z",),
    ),
    Program(
        name="data_parallel_tutorial",
        title="Optional: Data Parallelism (60 Minute Blitz)",
        repo=TUTORIALS,
        files=(SourceFile("beginner_source/blitz/data_parallel_tutorial.py",
                          "0ad33d606682537466f3430fc6d6ac7d47460f1a", "data_parallel_tutorial.py",
                          9897, "92a476607180be29f201ada645a59e6e0e0446caaf81cc81d7faa2ada0566a78"),),
        licence=BSD3_TUTORIALS,
        entry="data_parallel_tutorial.py",
        exercises="`torch.cuda.device_count() > 1`, `nn.DataParallel` over 2 GPUs (scatter, "
                  "replicate, parallel_apply, gather), `model.to(\"cuda:0\")`",
        compare=Compare(r"^Outside: input size torch.Size\(\[(\d+), 5\]\) "
                        r"output_size torch.Size\(\[(\d+), 2\]\)"),
        # The replicas print from DataParallel's threads, as on GPUs, so two replicas' print()
        # pieces may interleave ("\tIn Model: input size\tIn Model: input size  torch.Size(...").
        # The replica whose newline comes first still has all its pieces, in order, on one line:
        # that is what the patterns ask for.
        expect_stdout=(r"^Let's use 2 GPUs!$",
                       r"\tIn Model: input size.*torch\.Size\(\[15, 5\]\).*"
                       r"output size.*torch\.Size\(\[15, 2\]\)",
                       r"\tIn Model: input size.*torch\.Size\(\[5, 5\]\).*"
                       r"output size.*torch\.Size\(\[5, 2\]\)"),
        gpus_used=2,
    ),
    Program(
        name="model_parallel_tutorial",
        title="Single-Machine Model Parallel Best Practices",
        repo=TUTORIALS,
        files=(SourceFile("intermediate_source/model_parallel_tutorial.py",
                          "03b277366b12fc14f56a387cc5ec4cdf1ede744a", "model_parallel_tutorial.py",
                          14021, "b1054a66624099ded7a982c058a6c8678c59fbd3188758e740bf8ba3c86710c8"),),
        licence=BSD3_TUTORIALS,
        entry="model_parallel_tutorial.py",
        exercises="model parallel on two GPUs: `Linear(...).to('cuda:0')` and `.to('cuda:1')`, "
                  "activations copied `cuda:0 -> cuda:1`, backward across both GPUs, SGD step over "
                  "parameters on two devices",
        standin="torchvision stand-in without `torchvision.models` (see notes)",
        compare_note="no CPU run: the tutorial hard-codes `cuda:0` and `cuda:1`",
        expect_error=r"^ModuleNotFoundError: No module named 'torchvision.models'$",
        expect_error_at="model_parallel_tutorial.py:88",
        gpus_used=2,
        notes="Only its first part (the two-GPU ToyModel training step) runs: the rest needs "
              "`torchvision.models.resnet` (not installable beside this torch, and not stood in) "
              "and would time 12x10 ResNet-50 trainings on 120x128x128 batches, hours on 2 cores.",
    ),
    Program(
        name="examples_mnist",
        title="pytorch/examples MNIST",
        repo=EXAMPLES,
        files=(SourceFile("mnist/main.py", "cd01f93000a6679e768700dd29e417a1e5fd10e5", "main.py",
                          5129, "161a14ef575e9f8853bd463d2748ff803096b3bf0d8ccddf3aa7b359d9962632"),),
        licence=BSD3_EXAMPLES,
        entry="main.py",
        argv=("--epochs", "1", "--log-interval", "5"),
        exercises="CNN training with `use_cuda`, DataLoader `num_workers=1, pin_memory=True` "
                  "on the GPU run, Adadelta + StepLR, dropout on the GPU, evaluation with "
                  "`argmax`/`eq`/`.item()`",
        standin=TORCHVISION_MNIST,
        compare=Compare(rf"(?:\[0/\d+ \(0%\)\]\tLoss: ({FLOAT})|Accuracy: (\d+)/)", rtol=2e-2),
        compare_note="dropout runs on the GPU, where it draws from the CUDA generator, so later "
                     "losses legitimately differ from a CPU run; compared: the first loss "
                     "(before any step, ~ln 10) and the test accuracy count, within 2%",
    ),
    Program(
        name="ddp_series_single_gpu",
        title="DDP tutorial series: single_gpu.py",
        repo=EXAMPLES,
        files=(
            SourceFile("distributed/ddp-tutorial-series/single_gpu.py",
                       "11902294ca8f334cc12f94b367d7b1ee2cab1283", "single_gpu.py",
                       2784, "f30eeeb5b713c8f290d78f78bc8ebfbd22f518fa239aea111e9b32e32e99be03"),
            DDP_SERIES_DATAUTILS,
        ),
        licence=BSD3_EXAMPLES,
        entry="single_gpu.py",
        argv=("2", "1"),
        exercises="an integer device (`model.to(0)`, `tensor.to(0)`: \"shorthand for cuda:0\"), "
                  "DataLoader `pin_memory=True` with shuffling, SGD, checkpoint `torch.save` "
                  "of a GPU state_dict",
        compare_note="no CPU run: `device = 0` means cuda:0; the program prints no numbers",
        expect_stdout=(r"^\[GPU0\] Epoch 0 \| Batch size: 32 \| Steps: 64$",
                       r"^\[GPU0\] Epoch 1 \| Batch size: 32 \| Steps: 64$",
                       r"^Epoch 1 \| Training checkpoint saved at checkpoint.pt$"),
    ),
    Program(
        name="ddp_series_multigpu",
        title="DDP tutorial series: multigpu.py (torch.multiprocessing.spawn)",
        repo=EXAMPLES,
        files=(
            SourceFile("distributed/ddp-tutorial-series/multigpu.py",
                       "f62b4aec7bff832fc65b59aa62d60e94ddd6b39e", "multigpu.py",
                       3678, "faeb2eb580ec0d9e5f8ffd6b507bc6b9908c0bc03bbfc8c8e7aae0b472b3a99d"),
            DDP_SERIES_DATAUTILS,
        ),
        licence=BSD3_EXAMPLES,
        entry="multigpu.py",
        argv=("2", "1"),
        exercises="`mp.spawn(main, nprocs=torch.cuda.device_count())`, "
                  "`init_process_group(backend=\"nccl\", rank=rank, world_size=world_size)` with "
                  "MASTER_ADDR/MASTER_PORT, `torch.cuda.set_device(rank)`, `model.to(rank)`, "
                  "`DDP(model, device_ids=[gpu_id])` (broadcast, gradient all-reduce), "
                  "DistributedSampler with `set_epoch`, pin-memory DataLoader, rank 0 saving "
                  "`model.module.state_dict()`, `destroy_process_group()`",
        compare_note="no CPU run: the program hard-codes NCCL and one GPU per rank, and each rank "
                     "draws its own random data; checked instead: both ranks' epoch lines (32 "
                     "steps each: DistributedSampler halves the 2048 samples), and what the "
                     "observer records in the two rank processes: the same initial parameters "
                     "on both (DDP's broadcast: each process drew its own), the same final ones, "
                     "each rank's tensors on its own GPU, rank 0's checkpoint equal to its final "
                     "parameters, and final parameters equal to the initial ones (see notes)",
        expect_stdout=(r"\[GPU0\] Epoch 0 \| Batchsize: 32 \| Steps: 32",
                       r"\[GPU1\] Epoch 0 \| Batchsize: 32 \| Steps: 32",
                       r"\[GPU0\] Epoch 1 \| Batchsize: 32 \| Steps: 32",
                       r"\[GPU1\] Epoch 1 \| Batchsize: 32 \| Steps: 32",
                       r"Epoch 1 \| Training checkpoint saved at checkpoint.pt"),
        gpus_used=2,
        own_network=True,
        ranks=Ranks(world=2, checkpoint="checkpoint.pt", unchanged=True),
        notes="The tutorial's loss, `F.cross_entropy` of a `Linear(20, 1)` output (one column) "
              "against float targets of the same shape, is 0 for any data (a softmax over one "
              "class), so its gradients are 0 and SGD never moves the weights: on a CPU, a GPU "
              "or a simulated GPU, the checkpoint holds the initial weights. The program uses "
              "the fixed MASTER_PORT 12355.",
    ),
    Program(
        name="ddp_series_multigpu_torchrun",
        title="DDP tutorial series: multigpu_torchrun.py (torchrun --standalone)",
        repo=EXAMPLES,
        files=(
            SourceFile("distributed/ddp-tutorial-series/multigpu_torchrun.py",
                       "f62b4aec7bff832fc65b59aa62d60e94ddd6b39e", "multigpu_torchrun.py",
                       4025, "5a6c134e061f1b0decd23389c987e4e4de582259b549666ce3625613c8f531ae"),
            DDP_SERIES_DATAUTILS,
        ),
        licence=BSD3_EXAMPLES,
        entry="multigpu_torchrun.py",
        argv=("2", "1"),
        launch=TORCHRUN_2,
        exercises="started by `torchrun --standalone --nproc-per-node 2` (torch's elastic agent, "
                  "c10d rendezvous, RANK/LOCAL_RANK/WORLD_SIZE in the environment): "
                  "`init_process_group(backend=\"nccl\")` from the environment, "
                  "`torch.cuda.set_device(LOCAL_RANK)`, `DDP(device_ids=[LOCAL_RANK])`, "
                  "DistributedSampler with `set_epoch`, rank 0 saving a snapshot dict "
                  "(`MODEL_STATE`, `EPOCHS_RUN`)",
        compare_note="no CPU run (NCCL and one GPU per rank hard-coded, random data per rank); "
                     "checked as for ddp_series_multigpu, with the snapshot's MODEL_STATE",
        expect_stdout=(r"\[GPU0\] Epoch 0 \| Batchsize: 32 \| Steps: 32",
                       r"\[GPU1\] Epoch 0 \| Batchsize: 32 \| Steps: 32",
                       r"\[GPU0\] Epoch 1 \| Batchsize: 32 \| Steps: 32",
                       r"\[GPU1\] Epoch 1 \| Batchsize: 32 \| Steps: 32",
                       r"Epoch 1 \| Training snapshot saved at snapshot.pt"),
        gpus_used=2,
        ranks=Ranks(world=2, checkpoint="snapshot.pt", checkpoint_key="MODEL_STATE",
                    unchanged=True),
        notes="Same model and loss as multigpu.py (its gradients are 0, see there). torchrun "
              "runs in the runner's process as `python -m torch.distributed.run` does; its "
              "workers are new Python processes that see the simulated GPUs through devlab's "
              "start-up hook.",
    ),
    Program(
        name="ddp_series_multinode",
        title="DDP tutorial series: multinode.py (torch.accelerator), on one node",
        repo=EXAMPLES,
        files=(
            SourceFile("distributed/ddp-tutorial-series/multinode.py",
                       "17f4f9a5d66c6da5b348d032cd6a6e2410760952", "multinode.py",
                       4719, "98a72630510a6c2561799e3f032cac6c5918bcd11cf2f8f18928a2023da521b3"),
            DDP_SERIES_DATAUTILS,
        ),
        licence=BSD3_EXAMPLES,
        entry="multinode.py",
        argv=("2", "1"),
        launch=TORCHRUN_2,
        exercises="the device-generic API: `torch.accelerator.is_available()`, "
                  "`current_accelerator()`, `device_index(rank)`, "
                  "`torch.distributed.get_default_backend_for_device(device)` (nccl for cuda) "
                  "passed to `init_process_group`; global RANK beside LOCAL_RANK, DDP, "
                  "DistributedSampler with `set_epoch`, rank 0 saving a snapshot dict",
        compare_note="no CPU run (on a CPU it takes its gloo branch, another program; and its "
                     "data is random per rank); checked as for ddp_series_multigpu, with the "
                     "snapshot's MODEL_STATE",
        expect_stdout=(r"Running on rank 0 on device cuda:0",
                       r"Running on rank 1 on device cuda:1",
                       r"\[GPU0\] Epoch 1 \| Batchsize: 32 \| Steps: 32",
                       r"\[GPU1\] Epoch 1 \| Batchsize: 32 \| Steps: 32",
                       r"Epoch 1 \| Training snapshot saved at snapshot.pt"),
        gpus_used=2,
        ranks=Ranks(world=2, checkpoint="snapshot.pt", checkpoint_key="MODEL_STATE",
                    unchanged=True),
        notes="Written for several machines (torchrun on each, with a rendezvous endpoint); "
              "run here on one, as torchrun --standalone runs it, which it supports unchanged "
              "(ranks from RANK/LOCAL_RANK). Same model and loss as multigpu.py (its "
              "gradients are 0, see there).",
    ),
    Program(
        name="llms_from_scratch_ddp",
        title="Build a Large Language Model (From Scratch), Appendix A: DDP-script.py",
        repo="rasbt/LLMs-from-scratch",
        files=(SourceFile("appendix-A/01_main-chapter-code/DDP-script.py",
                          "75133605c5538a580b6996b46de7d066230f9e3f", "DDP-script.py",
                          5988, "e64231ad39c152dd66e799b7ea4e061c9c5a148f351a75ae668743bfa4d8b6e9"),),
        licence=APACHE_LLMS,
        entry="DDP-script.py",
        exercises="textbook chapter (Appendix A.9, training on several GPUs with DDP): "
                  "`torch.cuda.device_count()`, `mp.spawn` of one process per GPU, "
                  "`init_process_group(backend=\"nccl\")` (not Windows), "
                  "`torch.cuda.set_device(rank)`, `DDP(model, device_ids=[rank])`, "
                  "DistributedSampler with `set_epoch`, `pin_memory=True`, `drop_last=True`, "
                  "3 epochs of SGD, accuracy on each rank",
        compare=Compare(rf"^\[GPU(\d+)\] (?:Epoch: (\d+)/\d+ \| Batchsize (\d+) \| "
                        rf"Train/Val Loss: ({FLOAT})|Training accuracy ({FLOAT})|"
                        rf"Test accuracy ({FLOAT}))$", atol=0.011, by_process=r"^\[GPU(\d+)\]"),
        compare_note="the CPU run is a replay (references.llms_from_scratch_ddp): the program's "
                     "own network, data and accuracy function, in one CPU process, from rank 0's "
                     "initial parameters as the observer recorded them (each spawned process "
                     "draws its own random initial weights), each step applying the mean of the "
                     "two ranks' gradients; compared: each rank's 3 losses (printed with 2 "
                     "decimals, so within 0.011) and its training and test accuracy, and the "
                     "final parameters (rtol 1e-5); the ranks must also start and end equal",
        expect_stdout=(r"^CUDA available: True$", r"^Number of GPUs available: 2$"),
        gpus_used=2,
        own_network=True,
        ranks=Ranks(world=2, replay="llms_from_scratch_ddp"),
        notes="The stored version's header puts the file under the Apache License 2.0, the "
              "licence of the repository's later LICENSE.txt (earlier versions were MIT); the "
              "notice is in programs/LICENSES.md. The program uses the fixed MASTER_PORT 12345.",
    ),
    Program(
        name="llms_from_scratch_ddp_torchrun",
        title="Build a Large Language Model (From Scratch), Appendix A: DDP-script-torchrun.py",
        repo="rasbt/LLMs-from-scratch",
        files=(SourceFile("appendix-A/01_main-chapter-code/DDP-script-torchrun.py",
                          "d16863c7db81fb3de1131e4e9d4b84c32c450c5f", "DDP-script-torchrun.py",
                          7113, "381df839d5fedbef9dc21150267547ada8afd9d26b7a966c150578aa8ff5e892"),),
        licence=APACHE_LLMS,
        entry="DDP-script-torchrun.py",
        launch=TORCHRUN_2,
        exercises="the torchrun version of DDP-script.py (`torchrun --nproc_per_node=2`, as its "
                  "error message says): WORLD_SIZE/LOCAL_RANK from torchrun, MASTER_ADDR/PORT "
                  "left to torchrun, `torch.manual_seed(123)` in every rank, "
                  "`init_process_group(\"nccl\")`, `set_device(rank)`, "
                  "`DDP(device_ids=[rank])`, DistributedSampler with `set_epoch`, accuracy on "
                  "each rank",
        compare=Compare(rf"^\[GPU(\d+)\] (?:Epoch: (\d+)/\d+ \| Batchsize (\d+) \| "
                        rf"Train/Val Loss: ({FLOAT})|Training accuracy ({FLOAT})|"
                        rf"Test accuracy ({FLOAT}))$", atol=0.011, by_process=r"^\[GPU(\d+)\]"),
        compare_note="the CPU run is a replay (references.llms_from_scratch_ddp_torchrun) that "
                     "takes nothing from the simulated run: every rank seeds its generator with "
                     "123 before building the model, so the replay draws the same initial "
                     "weights on the CPU, then trains as DDP defines; compared: each rank's 3 "
                     "losses (2 decimals, within 0.011) and accuracies, and the initial and "
                     "final parameters (rtol 1e-5); the ranks must also start and end equal",
        expect_stdout=(r"^CUDA available: True$", r"^Number of GPUs available: 2$"),
        gpus_used=2,
        ranks=Ranks(world=2, replay="llms_from_scratch_ddp_torchrun"),
        notes="Header and licence as DDP-script.py (Apache License 2.0).",
    ),
    Program(
        name="nanogpt",
        title="nanoGPT train.py (GPT training loop)",
        repo="karpathy/nanoGPT",
        files=(
            SourceFile("train.py", "e2221318e607eb5ee0669d6b7641af25a2111545", "train.py",
                       14860, "c0350c90f5d3f4aa5d4e468f608759691c87979deef4ebda0db65a937088b988"),
            SourceFile("model.py", "04a1d697ddc57aadb2edbe95816bf86c6b8918b0", "model.py",
                       18537, "a1526372b028f93f45a72645b98b47b1a517d8b32cccc296ad7c7d72b420f5c1"),
            SourceFile("configurator.py", "1e016ae069026ccf6e27c09d172f0b8cfd7482b4",
                       "configurator.py", 1758,
                       "00f94af7a91796c93064e6e4f82dd5c119db17dc061d8a0371d0d40d6dc71290"),
        ),
        licence=MIT_NANOGPT,
        entry="train.py",
        argv=("--device=cuda", "--compile=False", "--wandb_log=False", "--dataset=synthetic_char",
              "--dtype=float16", "--batch_size=8", "--block_size=64", "--n_layer=2", "--n_head=4",
              "--n_embd=64", "--dropout=0.0", "--gradient_accumulation_steps=2",
              "--max_iters=20", "--eval_interval=10", "--eval_iters=4", "--log_interval=1",
              "--learning_rate=0.001", "--warmup_iters=5", "--lr_decay_iters=20",
              "--min_lr=0.0001", "--always_save_checkpoint=False"),
        cpu_argv=("--device=cpu", "--compile=False", "--wandb_log=False",
                  "--dataset=synthetic_char", "--dtype=float16", "--batch_size=8",
                  "--block_size=64", "--n_layer=2", "--n_head=4", "--n_embd=64", "--dropout=0.0",
                  "--gradient_accumulation_steps=2", "--max_iters=20", "--eval_interval=10",
                  "--eval_iters=4", "--log_interval=1", "--learning_rate=0.001",
                  "--warmup_iters=5", "--lr_decay_iters=20", "--min_lr=0.0001",
                  "--always_save_checkpoint=False"),
        exercises="AMP: `torch.amp.autocast(device_type='cuda', dtype=float16)` + "
                  "`torch.cuda.amp.GradScaler` (scale, unscale_, step, update), "
                  "`clip_grad_norm_`, fused AdamW (`fused=True` on cuda), gradient accumulation, "
                  "`pin_memory().to(device, non_blocking=True)`, `torch.cuda.is_bf16_supported()`, "
                  "checkpoint `torch.save` of model + optimizer state",
        standin="none for code; data files generated by the runner (datagen.nanogpt_char): "
                "data/synthetic_char/train.bin (20000 uint16 tokens), val.bin (4000), meta.pkl "
                "(vocab_size 65), shaped like nanoGPT's shakespeare_char",
        data="nanogpt_char",
        compare=Compare(rf"(?:iter \d+: loss |train loss |val loss )({FLOAT})", rtol=2e-2,
                        atol=1e-3),
        compare_note="CPU run with `--device=cpu` (nanoGPT then skips autocast); tolerance 2% "
                     "because float16 autocast on a real GPU moves these losses by up to ~1%",
        expect_stdout=(r"^using fused AdamW: True$", r"^saving checkpoint to out$"),
        notes="The stored train.py sets `wandb_log = True` by default (upstream: False); the "
              "run passes `--wandb_log=False`, as anyone without wandb must. The stored "
              "model.py carries an optional SVD-of-V path that is off by default "
              "(`use_svd=False`); both are versions from the nanoGPT repository network, kept "
              "byte for byte.",
    ),
    Program(
        name="llms_from_scratch_appendix_a",
        title="Build a Large Language Model (From Scratch), Appendix A part 2 (GPU training)",
        repo="rasbt/LLMs-from-scratch",
        files=(SourceFile("appendix-A/01_main-chapter-code/code-part2.ipynb",
                          "08040f024c35ceb4f7a0ad7c5df4747ef632d349", "code-part2.ipynb",
                          12613, "a294469cc9df0abfa95990e42b532951e273842728ffde8eefee4918bee9a9e8"),),
        licence=MIT_LLMS,
        entry="code-part2.ipynb",
        exercises="textbook chapter (A.9 'Optimizing training performance with GPUs'): "
                  "`tensor.to(\"cuda\")`, the mixed-device RuntimeError the book shows on purpose, "
                  "single-GPU training with DataLoader `num_workers=1`, accuracy on the GPU",
        compare_note="the notebook's code cells run in order in an IPython shell (errors "
                     "recorded, execution goes on, as nbclient --allow-errors); each cell's "
                     "output is compared with the output the notebook stores from the author's "
                     "T4 GPU run (all code cells but the first, which prints the torch version)",
        notebook_cells=(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12),
    ),
)


# ---------------------------------------------------------------- frameworks (issue 19)
# Lightning and accelerate, started as their users start them: a script with Lightning's
# Trainer (its settings through Lightning's own PL_TRAINER_* variables), `fabric run`,
# `accelerate launch`, and notebooks in a real Jupyter kernel (Lightning's `ddp_notebook`,
# accelerate's `notebook_launcher`), whose ranks are forked from the kernel.
LIGHTNING = "Lightning-AI/pytorch-lightning"
ACCELERATE = "huggingface/accelerate"
BUG_REPORT_MODEL = SourceFile(
    "examples/pytorch/bug_report/bug_report_model.py", "1b26ac4cf5c82500426a9c65f04514f3d02be84e",
    "bug_report_model.py", 1701, "5b40c80c42efd713000d6c4a4b3aaeafea0cb3ccea792edebf583fc1a64863b0")
LIGHTNING_CHECKPOINT = "lightning_logs/version_0/checkpoints/*.ckpt"  # ModelCheckpoint's default
ACCELERATE_SCRIPTS = "src/accelerate/test_utils/scripts/"
ACCELERATE_LAUNCH = ("accelerate", "launch", "--multi_gpu", "--num_processes", "2",
                     "--main_process_port", "0")  # port 0: accelerate picks a free one
# Lightning prints its test table plain, or with rich's box characters where rich is installed
# (transformers' typer brings it): "│ test_loss │ 2.13... │".
TEST_LOSS = rf"^\s*│?\s*test_loss\s*│?\s+({FLOAT})\s*│?\s*$"

FRAMEWORKS: tuple[Program, ...] = (
    Program(
        name="lightning_bug_report_1gpu",
        title="Lightning's bug-report model (Trainer on one GPU)",
        repo=LIGHTNING,
        files=(BUG_REPORT_MODEL,),
        licence=APACHE_LIGHTNING,
        entry="bug_report_model.py",
        env=(("PL_TRAINER_ACCELERATOR", "gpu"), ("PL_TRAINER_DEVICES", "1")),
        cpu_env=(("PL_TRAINER_ACCELERATOR", "cpu"), ("PL_TRAINER_DEVICES", "1")),
        standins=(),
        exercises="Lightning's `Trainer` with `accelerator=\"gpu\", devices=1` (from Lightning's "
                  "own PL_TRAINER_* settings, which Trainer reads as its defaults): the "
                  "LightningModule moved to cuda:0, `fit` (one training and one validation "
                  "batch, SGD), `test`, `self.log` of GPU values, ModelCheckpoint saving GPU "
                  "tensors, the results table",
        compare=Compare(TEST_LOSS, rtol=1e-5, atol=1e-6),
        compare_note="CPU run with PL_TRAINER_ACCELERATOR=cpu; the runner seeds torch with 0 "
                     "before the script, so both runs draw the same data and weights; compared: "
                     "the test loss after one SGD step",
        expect_stdout=(TEST_LOSS,),
    ),
    Program(
        name="lightning_bug_report_ddp",
        title="Lightning's bug-report model (Trainer, strategy=\"ddp\", two GPUs, from a script)",
        repo=LIGHTNING,
        files=(BUG_REPORT_MODEL,),
        licence=APACHE_LIGHTNING,
        entry="bug_report_model.py",
        env=(("PL_TRAINER_ACCELERATOR", "gpu"), ("PL_TRAINER_DEVICES", "2"),
             ("PL_TRAINER_STRATEGY", "ddp")),
        standins=(),
        exercises="`Trainer(accelerator=\"gpu\", devices=2, strategy=\"ddp\")` from a script "
                  "(through PL_TRAINER_*): the script's own process is rank 0 and Lightning "
                  "starts rank 1 as a new process running the same script; "
                  "`init_process_group(\"nccl\", device_id=...)`, `barrier()` on the bound "
                  "device, DDP, the DistributedSampler Lightning injects, ModelCheckpoint on "
                  "rank 0, `test` on both ranks",
        compare_note="no CPU run: each rank draws its own random data (rank 1 is a fresh, "
                     "unseeded process), so no one process computes the same; checked: both "
                     "ranks on their own GPU, starting and ending with the same parameters, and "
                     "the checkpoint holding rank 0's final ones",
        expect_stdout=(TEST_LOSS,),
        gpus_used=2,
        ranks=Ranks(world=2, checkpoint=LIGHTNING_CHECKPOINT, checkpoint_key="state_dict"),
    ),
    Program(
        name="lightning_ddp_notebook",
        title="Lightning's bug-report notebook (strategy=\"ddp_notebook\", in a Jupyter kernel)",
        repo=LIGHTNING,
        files=(SourceFile("examples/pytorch/bug_report/bug_report_model.ipynb",
                          "da572d7ccafee45f081a94f9b7cad04bd72059d3", "bug_report_model.ipynb",
                          15712, "85e8bca161e51d21fc42dded78e6f21fd982203f667e2e585c1e02a5ed253163"),),
        licence=APACHE_LIGHTNING,
        entry="bug_report_model.ipynb",
        kernel=True,
        skip_cells=(0, 7, 8),
        env=(("PL_TRAINER_ACCELERATOR", "gpu"), ("PL_TRAINER_DEVICES", "2"),
             ("PL_TRAINER_STRATEGY", "ddp_notebook")),
        standins=(),
        exercises="the notebook Lightning asks bug reports in, run cell by cell in a real "
                  "Jupyter kernel with `strategy=\"ddp_notebook\"`: Lightning checks that CUDA "
                  "was not initialized in the kernel and forks the two ranks from it; the "
                  "model and data the notebook's cells made reach the ranks through the fork; "
                  "NCCL process group, DDP, checkpoint on rank 0, `test` forking two ranks "
                  "again",
        compare_note="no CPU run: the notebook draws its data unseeded in the kernel; checked as "
                     "lightning_bug_report_ddp (ranks on their own GPU, equal at start and end, "
                     "the checkpoint)",
        expect_stdout=(TEST_LOSS,),
        gpus_used=2,
        ranks=Ranks(world=2, checkpoint=LIGHTNING_CHECKPOINT, checkpoint_key="state_dict"),
        notes="Code cells 0, 7 and 8 are not run: they set up the author's environment "
              "(`! pip install -qU pytorch-lightning`, which would replace the pinned "
              "Lightning, and `! wget` of a script from GitHub, then running it); the corpus "
              "installs its pins itself and has no internet. The notebook imports "
              "`pytorch_lightning`, which lightning 2.6.6 installs beside `lightning`.",
    ),
    Program(
        name="lightning_fabric_image_classifier",
        title="Lightning Fabric's MNIST image classifier (`fabric run`, strategy ddp, two GPUs)",
        repo=LIGHTNING,
        files=(SourceFile("examples/fabric/image_classifier/train_fabric.py",
                          "89dbc55e12d6c6ed15aefc093224e92920223b96", "train_fabric.py",
                          7518, "4b9430c1975b705826557aa7b108e8a210ef789cd015c006dfbb8ee075ff0b93"),),
        licence=APACHE_LIGHTNING,
        entry="train_fabric.py",
        launch=("fabric", "run", "--accelerator=gpu", "--devices=2", "--strategy=ddp"),
        argv=("--epochs=1", "--save-model"),
        standins=("standins", "standins-torchmetrics"),
        own_network=True,
        exercises="`fabric run --accelerator=gpu --devices=2 --strategy=ddp` (Fabric's CLI "
                  "starting torchrun's agent, Fabric reading its settings from the LT_* "
                  "variables the CLI sets): `Fabric()`, `seed_everything` in each rank, "
                  "`rank_zero_first`, `setup_dataloaders` (DistributedSampler), `setup` (DDP on "
                  "cuda:rank), `fabric.backward`, Adadelta + StepLR, dropout, torchmetrics "
                  "Accuracy on the GPU, `fabric.all_gather` of a Python float, `fabric.save` "
                  "on rank 0",
        standin=TORCHVISION_MNIST + "; torchmetrics (imported by the program and by Lightning) "
                "finds the stand-in and imports resnet50, vgg16 and VGG16_Weights from "
                "torchvision.models: standins-torchmetrics has those names, as functions that "
                "raise",
        compare_note="no CPU run: dropout on a GPU draws from the CUDA generator, so every loss "
                     "after the first forward legitimately differs from a CPU run's; checked: "
                     "both ranks on their own GPU, starting from the same weights and ending "
                     "with the same ones (DDP), mnist_cnn.pt holding rank 0's final weights, "
                     "and the training and test lines each rank prints",
        expect_stdout=(rf"^Train Epoch: 1 \[0/1280 \(0%\)\]\tLoss: {FLOAT}$",
                       rf"^Train Epoch: 1 \[576/1280 \(90%\)\]\tLoss: {FLOAT}$",
                       rf"^Test set: Average loss: {FLOAT}, Accuracy: \(\d+%\)$"),
        gpus_used=2,
        ranks=Ranks(world=2, checkpoint="mnist_cnn.pt"),
        timeout=600.0,  # ~50 s of CPU time over three processes: minutes on loaded shared cores
        notes="`--epochs=1` is what Lightning's own examples CI runs it with "
              "(examples/run_fabric_examples.sh); with the stand-in's 1280 training samples "
              "and batch size 64 each rank takes 10 steps. `fabric run` listens on its default "
              "main port, 29400.",
    ),
    Program(
        name="accelerate_test_script",
        title="accelerate's end-to-end test script (`accelerate launch --multi_gpu`)",
        repo=ACCELERATE,
        files=(SourceFile(ACCELERATE_SCRIPTS + "test_script.py",
                          "4826b66d4d4b7c60a2722e83dfe90347fd971502", "test_script.py",
                          34740, "698b0b4250a6d1ac7facb381a9e55a71ab9a0b179f8e0bac3ce38d8a2c275c92"),),
        licence=APACHE_ACCELERATE,
        entry="test_script.py",
        launch=ACCELERATE_LAUNCH,
        standins=(),
        exercises="accelerate's own test of a multi-GPU set-up (what `accelerate test` runs): "
                  "`Accelerator`/`PartialState` on MULTI_GPU with NCCL, process execution "
                  "order, `split_between_processes`, RNG synchronisation, data loader sharding "
                  "and dispatching (`gather`, `broadcast`, seedable samplers), DDP training "
                  "compared by the script with one process trained on all the data (with and "
                  "without batch split, fp32 wrapper, bf16 and fp16 autocast), breakpoint "
                  "trigger, re-instantiated state",
        compare_note="no CPU run: the script checks itself with assertions, among them that "
                     "DDP training on the two GPUs ends with the model one process trains on "
                     "the whole data (`training_check`); checked here: exit status 0, both "
                     "ranks on their own GPU, and the lines that say each part passed",
        expect_stdout=(r"^Distributed environment: DistributedType\.MULTI_GPU  Backend: nccl$",
                       r"^Device: cuda:0$", r"^Device: cuda:1$",
                       r"^All rng are properly synched\.$",
                       r"^Shuffled central dataloader passing\.$",
                       r"^Training yielded the same results on one CPU or distributed setup "
                       r"with batch split\.$",
                       r"^BF16 training check\.$", r"^FP16 training check\.$",
                       r"^\*\*Test reinstantiated state\*\*$"),
        gpus_used=2,
        ranks=Ranks(world=2, trains=False),
        notes="The datasets.Dataset part is skipped by the script itself (Hugging Face "
              "datasets is not installed), as it says.",
    ),
    Program(
        name="accelerate_test_ops",
        title="accelerate's collective operations test (`accelerate launch --multi_gpu`)",
        repo=ACCELERATE,
        files=(SourceFile(ACCELERATE_SCRIPTS + "test_ops.py",
                          "cde3e58b8f28abce20c3267b5fa78a3a60acfa94", "test_ops.py",
                          6683, "ff0d2ed734cc1a80795ea0f0d43070a6710652d46c1e0860e63d4eb6228ae69a"),),
        licence=APACHE_ACCELERATE,
        entry="test_ops.py",
        launch=ACCELERATE_LAUNCH,
        standins=(),
        exercises="accelerate's operations on GPU tensors across processes: `gather` "
                  "(`all_gather_into_tensor` into a flat output, as NCCL accepts), "
                  "`gather_object`, non-contiguous gather, `broadcast`, "
                  "`pad_across_processes`, `reduce` (sum, mean), max, the operation checker's "
                  "error for mismatched shapes, `copy_tensor_to_devices`",
        compare_note="no CPU run: the script asserts each result itself",
        expect_stdout=(r"^testing gather$", r"^testing reduce_mean$",
                       r"^testing sending tensors across devices$"),
        gpus_used=2,
        ranks=Ranks(world=2, trains=False),
    ),
    Program(
        name="accelerate_test_sync",
        title="accelerate's gradient synchronisation test (`accelerate launch --multi_gpu`)",
        repo=ACCELERATE,
        files=(SourceFile(ACCELERATE_SCRIPTS + "test_sync.py",
                          "a5cb37c17813a9d938ad3dac70b95fc58ebedbc3", "test_sync.py",
                          19027, "05fd0921da9d94e80391aaad570e26f90a6b4cbc3d218f2c2b15e9d0908949ce"),),
        licence=APACHE_ACCELERATE,
        entry="test_sync.py",
        launch=ACCELERATE_LAUNCH,
        standins=(),
        exercises="DDP's `no_sync` through `accelerator.no_sync` and `accumulate`: gradients "
                  "of a DDP model on each GPU compared, step by step, with a plain model's "
                  "(equal when synchronised, different when not), with multiple forwards, "
                  "gradient accumulation with an optimizer and scheduler, `split_batches`, "
                  "`dispatch_batches`, `sync_each_batch`, a data loader ending mid-accumulation",
        compare_note="no CPU run: the script asserts the gradients itself",
        expect_stdout=(r"^\*\*Test Distributed `no_sync` context manager\*\*$",
                       r"^\*\*Test `accumulate` gradient accumulation with optimizer and "
                       r"scheduler, +`split_batches=False` and `dispatch_batches=False` and "
                       r"`sync_each_batch=True`\*\*$"),
        gpus_used=2,
        ranks=Ranks(world=2, trains=False),
    ),
    Program(
        name="accelerate_ddp_comm_hook",
        title="accelerate's DDP communication hook test (`accelerate launch --multi_gpu`)",
        repo=ACCELERATE,
        files=(SourceFile(ACCELERATE_SCRIPTS + "test_ddp_comm_hook.py",
                          "d9e6af87739a0400c8920aa8950f5995f0a25137", "test_ddp_comm_hook.py",
                          3566, "93ffb63018cb28d74c1887277936ee19df382b4e56a75184417e8351517d501c"),),
        licence=APACHE_ACCELERATE,
        entry="test_ddp_comm_hook.py",
        launch=ACCELERATE_LAUNCH,
        standins=(),
        exercises="DDP communication hooks through `DistributedDataParallelKwargs`: fp16 and "
                  "bf16 compression (bf16 needs NCCL 2.10+, which the simulated GPUs report), "
                  "PowerSGD and batched PowerSGD, alone and wrapped in fp16/bf16, a rank-2 "
                  "approximation; each hook's gradients compared with plain DDP's",
        compare_note="no CPU run: the script compares each hook's gradients with DDP's without "
                     "a hook (`torch.testing.assert_close`, rtol and atol 1e-2)",
        expect_stdout=(r"^Test DDP comm hook: bf16, comm wrapper: no$",
                       r"^Test DDP comm hook: batched_power_sgd, comm wrapper: bf16$"),
        gpus_used=2,
        ranks=Ranks(world=2, trains=False),
    ),
    Program(
        name="accelerate_test_merge_weights",
        title="accelerate's FSDP sharded-checkpoint merge test (`accelerate launch --multi_gpu`, "
              "FSDP1)",
        repo=ACCELERATE,
        files=(SourceFile(ACCELERATE_SCRIPTS + "test_merge_weights.py",
                          "b0d8fa95f4eebc359bf41b73cae91d2737cde338", "test_merge_weights.py",
                          5982, "af5a2a3ce30ea8b7b9cd67a75964f297d7036db90525a76934d88f341960475f"),),
        licence=APACHE_ACCELERATE,
        entry="test_merge_weights.py",
        launch=ACCELERATE_LAUNCH,
        standins=(),
        exercises="accelerate's FSDP plugin (FSDP version 1: `FullyShardedDataParallel`, "
                  "`FULL_SHARD`, size-based auto wrap) with `StateDictType.SHARDED_STATE_DICT`: "
                  "3 epochs of SGD through `accelerator.prepare`/`backward`, flat parameters "
                  "unsharded and resharded on every forward and backward (`record_stream` on "
                  "simulated streams), gradients reduce-scattered; `save_fsdp_model` writes the "
                  "sharded state dict with `torch.distributed.checkpoint` (DCP) from both "
                  "ranks, then `merge_fsdp_weights` and `accelerate merge-weights` read the "
                  "checkpoint back with DCP in one process into safetensors and "
                  "pytorch_model.bin",
        compare_note="no CPU run: the script asserts itself that each merged file loads into a "
                     "fresh `TinyModel` equal to the trained FSDP model's state dict "
                     "(`torch.allclose`) and unequal to an untrained one",
        gpus_used=2,
        ranks=Ranks(world=2),
        notes="Its sizes are fixed (a 16-16-16 model, 128 samples, 3 epochs); it has no flags. "
              "It writes and removes test_merge_weights_fsdp_weights/ in the run's folder.",
    ),
    Program(
        name="accelerate_merge_weights_offload_bf16",
        title="accelerate's FSDP sharded-checkpoint merge test with CPU offload and bf16 mixed "
              "precision (`accelerate launch --use_fsdp --fsdp_offload_params true "
              "--mixed_precision bf16`, FSDP1)",
        repo=ACCELERATE,
        files=(SourceFile(ACCELERATE_SCRIPTS + "test_merge_weights.py",
                          "b0d8fa95f4eebc359bf41b73cae91d2737cde338", "test_merge_weights.py",
                          5982, "af5a2a3ce30ea8b7b9cd67a75964f297d7036db90525a76934d88f341960475f"),),
        licence=APACHE_ACCELERATE,
        entry="test_merge_weights.py",
        files_of="accelerate_test_merge_weights",
        launch=("accelerate", "launch", "--use_fsdp", "--num_processes", "2",
                "--main_process_port", "0", "--fsdp_offload_params", "true",
                "--mixed_precision", "bf16"),
        standins=(),
        exercises="the same script as accelerate_test_merge_weights, launched as accelerate's "
                  "users ask for FSDP1 with CPU offload and mixed precision: the plugin reads "
                  "`FSDP_OFFLOAD_PARAMS` (`CPUOffload(offload_params=True)`: each rank's flat "
                  "parameter shard and its gradient live in host memory, copied to the GPU "
                  "for each all-gather) and the Accelerator bf16 (`MixedPrecision` with bf16 "
                  "parameters, reductions and buffers for the forward and backward passes, "
                  "autocast around the forward); SGD on the CPU shards; the sharded state "
                  "dict saved with DCP and merged back in one process",
        compare_note="no CPU run: the script asserts itself that each merged file loads into a "
                     "fresh `TinyModel` equal to the trained FSDP model's state dict "
                     "(`torch.allclose`) and unequal to an untrained one; the ranks must start "
                     "and end with the same (gathered) parameters",
        gpus_used=2,
        ranks=Ranks(world=2),
        notes="Its sizes are fixed (a 16-16-16 model, 128 samples, 3 epochs); it has no flags. "
              "The file is accelerate_test_merge_weights' stored copy (`files_of`).",
    ),
    Program(
        name="accelerate_notebook_launcher",
        title="accelerate's notebook_launcher test (in a Jupyter kernel)",
        repo=ACCELERATE,
        files=(SourceFile(ACCELERATE_SCRIPTS + "test_notebook.py",
                          "1afc3d8cbbd37c9bdd94771163e912c51cb3f3a6", "test_notebook.py",
                          5051, "b9a2328aebfbf2ad9e16392552aebeff9fade06a905c4b057bf655781fcc6687"),),
        licence=APACHE_ACCELERATE,
        entry="test_notebook.py",
        kernel=True,
        env=(("ACCELERATE_NUM_PROCESSES", "2"), ("OMP_NUM_THREADS", "1")),
        standins=(),
        own_network=True,
        # Its `main()` but `test_fault_tolerant`, whose ranks race on a multiprocessing queue
        # (see notes), one cell per test as a notebook user would call them.
        cells=("print('Test basic notebook can be ran')\ntest_can_initialize()",
               "print('Test clean CUDA fork (regression test for #3925)')\n"
               "test_clean_cuda_fork()",
               "print('Test static rendezvous backend')\ntest_static_rdzv_backend()",
               "print('Test c10d rendezvous backend')\ntest_c10d_rdzv_backend()",
               "print('Test monitoring')\ntest_monitoring()",
               "PartialState().destroy_process_group()"),
        exercises="`notebook_launcher(fn, num_processes=2)` from notebook cells in a real "
                  "Jupyter kernel: accelerate checks that CUDA was not initialized in the "
                  "kernel and forks two ranks on the two GPUs; each child's clean-fork check "
                  "(`torch._C._cuda_isInBadFork`), static and c10d rendezvous, the monitor "
                  "stopping a sleeping rank when the other fails",
        compare_note="no CPU run: the script asserts what it tests itself; checked here: the "
                     "cell ends without an error and each rank's state names its own GPU",
        expect_stdout=(r"^Test basic notebook can be ran$", r"^Device: cuda:0$",
                       r"^Device: cuda:1$", r"^Test clean CUDA fork",
                       r"^Test static rendezvous backend$", r"^Test c10d rendezvous backend$",
                       r"^Test monitoring$"),
        gpus_used=0,
        timeout=240.0,
        notes="The script is loaded in a Jupyter kernel with `%run -n` and its tests called "
              "one per cell as its `main()` calls them, with the environment accelerate's own "
              "test gives it (ACCELERATE_NUM_PROCESSES=2, OMP_NUM_THREADS=1). Its ranks create "
              "no tensor, so no GPU memory is expected (gpus_used=0); each prints its "
              "`PartialState`, device included. notebook_launcher listens on port 29500 "
              "(its default `use_port`). Left out: `test_fault_tolerant`, which hangs now and "
              "then on any machine: each rank takes a trial count from a shared "
              "`multiprocessing.Queue`, and the one that takes it puts it back less one before "
              "raising; a rank that calls `queue.empty()` before that put reaches the pipe "
              "returns at once, and if the count put back is 0, the next round's rank that takes "
              "it waits in `init_process_group` for a peer that has already returned (seen "
              "here: one rank in `PartialState()`, the other finished; 2 of 3 runs under load).",
    ),
)
CORPUS += FRAMEWORKS

# --- torch.distributed's NCCL semantics, DTensor, tensor parallelism, FSDP2 (wp-nccl) ---------
TP_LOG_UTILS = SourceFile(
    "distributed/tensor_parallelism/log_utils.py", "f8c79f153a104be5578bee44d64f79d925ea22a4",
    "log_utils.py", 611, "57ab033bd4c0d67fd55e8ffc23164ccafe87034aea82f4ca8f1a994ef01adb04")

NCCL_PROGRAMS: tuple[Program, ...] = (
    Program(
        name="examples_ddp_example",
        title="pytorch/examples distributed/ddp/example.py (torchrun)",
        repo=EXAMPLES,
        files=(SourceFile("distributed/ddp/example.py",
                          "f84bcb398d9e06b67e3d36b56b5522bba0cf6210", "example.py", 3481,
                          "a261723f015d6bce1247450c5a8732a8702f3158a89a7a0032c6a120f7065c86"),),
        licence=BSD3_EXAMPLES,
        entry="example.py",
        launch=TORCHRUN_2,
        exercises="`torch.accelerator.current_accelerator()`, "
                  "`get_default_backend_for_device` (nccl), `set_device_index`, "
                  "`init_process_group(backend)`, printing `dist.get_backend()`, "
                  "`DDP(device_ids=[rank])` with a CPU input DDP moves to the GPU, one SGD step",
        compare_note="no CPU run (NCCL and one GPU per rank; each rank draws its own unseeded "
                     "data); checked: each rank prints backend=nccl, as on a GPU machine, and "
                     "the ranks start and end with the same parameters",
        expect_stdout=(r"world_size = 2, rank = 0, backend=nccl",
                       r"world_size = 2, rank = 1, backend=nccl",
                       r"^training completed in rank 0!$", r"^training completed in rank 1!$"),
        gpus_used=2,
        ranks=Ranks(world=2),
    ),
    Program(
        name="examples_tensor_parallel",
        title="pytorch/examples distributed/tensor_parallelism/tensor_parallel_example.py",
        repo=EXAMPLES,
        files=(SourceFile("distributed/tensor_parallelism/tensor_parallel_example.py",
                          "77f55b912142e11fcfdf5b530231fb9c52f181e8",
                          "tensor_parallel_example.py", 3975,
                          "bec82850ab873b31a79814fb71ce74852d28e1d5a3a9d21bffcdd7e6d4d4bce0"),
               TP_LOG_UTILS),
        licence=BSD3_EXAMPLES,
        entry="tensor_parallel_example.py",
        launch=TORCHRUN_2,
        exercises="`init_device_mesh(\"cuda\", (2,))`, `parallelize_module` with "
                  "`ColwiseParallel`/`RowwiseParallel` (DTensor parameters sharded over the "
                  "two GPUs, the row-wise layer's all-reduce), a backward through "
                  "`DTensor.from_local`, foreach AdamW over DTensors, 10 iterations",
        compare_note="the CPU run is a replay (references.examples_tensor_parallel): the "
                     "program's ToyModel on the CPU from rank 0's initial parameters (the "
                     "observer gathers each DTensor parameter whole), its 10 iterations of "
                     "AdamW on `torch.manual_seed(i); torch.rand(20, 10)` (without zero_grad, "
                     "as the program); compared: the initial and final parameters, rtol 1e-4; "
                     "the ranks must also start and end equal",
        expect_stdout=(r"^Starting PyTorch TP example on rank 0\.$",
                       r"^Starting PyTorch TP example on rank 1\.$"),
        gpus_used=2,
        ranks=Ranks(world=2, replay="examples_tensor_parallel", rtol=1e-4, atol=1e-5),
        notes="The program seeds nothing before building its model: distribute_tensor sends "
              "rank 0's initial weights to both ranks (src_data_rank=0), which the replay "
              "starts from. Its inputs come from torch.manual_seed(i) each iteration, so the "
              "replay draws the same ones on the CPU (a simulated GPU draws from the CPU's "
              "generator; on a real GPU these numbers come from the CUDA generator).",
    ),
    Program(
        name="examples_sequence_parallel",
        title="pytorch/examples distributed/tensor_parallelism/sequence_parallel_example.py",
        repo=EXAMPLES,
        files=(SourceFile("distributed/tensor_parallelism/sequence_parallel_example.py",
                          "77f55b912142e11fcfdf5b530231fb9c52f181e8",
                          "sequence_parallel_example.py", 3324,
                          "dc8a1d6aecac3b7cae9c734013f5ff36252fabc2bb7a9cb6925b35013e07d3c2"),
               TP_LOG_UTILS),
        licence=BSD3_EXAMPLES,
        entry="sequence_parallel_example.py",
        launch=TORCHRUN_2,
        exercises="sequence parallelism: `ColwiseParallel(input_layouts=Shard(0))` and "
                  "`RowwiseParallel(output_layouts=Shard(0))` (all-gather in, reduce-scatter "
                  "out), different inputs per rank, foreach AdamW over DTensors",
        compare_note="no CPU run: each rank draws its own unseeded inputs; checked: the ranks "
                     "start and end with the same (gathered) parameters",
        expect_stdout=(r"^Starting PyTorch Sequence Parallel example on rank 0\.$",
                       r"^Starting PyTorch Sequence Parallel example on rank 1\.$"),
        gpus_used=2,
        ranks=Ranks(world=2),
    ),
    Program(
        name="examples_fsdp2",
        title="pytorch/examples distributed/FSDP2/example.py",
        repo=EXAMPLES,
        files=(
            SourceFile("distributed/FSDP2/example.py", "5a4ca9269f689acfc8fcf2118bcb27470e28dd2f",
                       "example.py", 4136,
                       "f84fb0503517ee5c6a6100c69bd0ccc55431e141643a32de88fadfb3407ecc6c"),
            SourceFile("distributed/FSDP2/model.py", "70922969e70218458d2a945bf86fd8cc967fc6ea",
                       "model.py", 4604,
                       "0217ad585158062fc6f61ada9dbe1493bf70d4fd9be94b48aad82d255634186d"),
            SourceFile("distributed/FSDP2/utils.py", "70922969e70218458d2a945bf86fd8cc967fc6ea",
                       "utils.py", 675,
                       "d6b548bdf0285d2a20d8a149ebbe57fa09f178b469b70880db69e4ffab14c93d"),
            SourceFile("distributed/FSDP2/checkpoint.py",
                       "70922969e70218458d2a945bf86fd8cc967fc6ea", "checkpoint.py", 7707,
                       "1853b455639d6b761a695ca2140f104602b1a61d1a96afce2ae3959b20058ad6"),
        ),
        licence=BSD3_EXAMPLES,
        entry="example.py",
        launch=TORCHRUN_2,
        exercises="FSDP2: `torch.accelerator.device_index`, `init_process_group(device_id=)`, "
                  "a Transformer built on the meta device, `fully_shard` per layer and whole, "
                  "`to_empty(device=cuda:r)` and `reset_parameters` on DTensor shards, "
                  "all-gather (unshard) and reshard per layer, gradient reduce-scatter, "
                  "`clip_grad_norm_` over DTensors, Adam, 10 steps, a full state-dict "
                  "checkpoint (`torch.distributed.checkpoint.state_dict`)",
        compare_note="the CPU run is a replay (references.examples_fsdp2): the program's "
                     "Transformer on the CPU from rank 0's initial parameters (gathered whole), "
                     "10 steps of Adam with clip_grad_norm_ on the batches the ranks draw (both "
                     "ranks draw the same: DTensor's random ops leave their generators in one "
                     "state, as CUDA's tracker does); compared: the initial and final "
                     "parameters; the ranks must also start and end equal",
        expect_stdout=(r"^Running on rank 0 on device cuda:0$",
                       r"^Running on rank 1 on device cuda:1$"),
        gpus_used=2,
        ranks=Ranks(world=2, replay="examples_fsdp2", rtol=1e-4, atol=1e-5),
        timeout=360.0,
        notes="Its sizes are fixed in the program (10 layers, vocabulary 1024, batches of "
              "32x64 tokens); it has no flags to make it smaller. It writes its checkpoint "
              "under checkpoints/ in the run's temporary folder.",
    ),
)

CORPUS += NCCL_PROGRAMS

# --- FSDP version 1 (issue 29) -------------------------------------------------------------------
CORPUS += (
    Program(
        name="fsdp1_tutorial",
        title="Getting Started with Fully Sharded Data Parallel (FSDP1 tutorial, mp.spawn, "
              "2 ranks)",
        repo=TUTORIALS,
        files=(SourceFile("intermediate_source/FSDP1_tutorial.rst",
                          "7f42e47c32a45b1142de7336c44f8ecbf5275037", "FSDP1_tutorial.rst",
                          19599, "1a666097ba78cf58e8ad626453d451aae31c3c2ab9aa4d7c0479f32151a33da8"),),
        licence=BSD3_TUTORIALS,
        entry="FSDP1_tutorial.rst",
        rst_blocks=7,
        argv=("--epochs", "1", "--batch-size", "320", "--save-model"),
        standin=TORCHVISION_MNIST,
        exercises="FSDP version 1 (`FullyShardedDataParallel(model)`, one flat parameter "
                  "sharded over the two GPUs) from `mp.spawn` with `init_process_group(\"nccl\")` "
                  "and `torch.cuda.set_device(rank)`: all-gather before forward and backward, "
                  "`record_stream` and reshard after them on simulated streams, gradient "
                  "reduce-scatter, Adadelta on the shards, DataLoader workers with pinned "
                  "memory, `dist.all_reduce` of the losses, CUDA events' elapsed time, the "
                  "FSDP module's repr, a full state dict (`model.state_dict()`, "
                  "`FULL_STATE_DICT`) saved by rank 0",
        compare=Compare(rf"^(?:Train Epoch: 1 \tLoss|Test set: Average loss): ({FLOAT})",
                        rtol=1e-4),
        compare_note="the CPU run is a replay (references.fsdp1_tutorial): the tutorial's Net "
                     "built from a fresh process's generator as each spawned rank builds it, "
                     "one epoch of Adadelta on the mean of the two ranks' gradients (FSDP's "
                     "reduce-scatter), each rank's batches (its DistributedSampler) and dropout "
                     "masks drawn from that rank's generator; compared: the epoch's training "
                     "loss and the test loss the program prints (rtol 1e-4), the initial and "
                     "final parameters (the observer gathers the flat parameter's shards); the "
                     "ranks must start and end equal and mnist_cnn.pt hold rank 0's final "
                     "parameters",
        expect_stdout=(r"^CUDA event elapsed time: [0-9.e-]+sec$",
                       r"^FullyShardedDataParallel\($",
                       r"^  \(_fsdp_wrapped_module\): Net\($"),
        gpus_used=2,
        own_network=True,
        ranks=Ranks(world=2, checkpoint="mnist_cnn.pt", replay="fsdp1_tutorial", rtol=1e-4,
                    atol=1e-6),
        timeout=600.0,  # three processes and four DataLoader workers: minutes on loaded cores
        notes="The tutorial's program is the first seven python blocks, which it tells its "
              "reader to put into FSDP_mnist.py; its later blocks show variants of lines of "
              "`fsdp_main` (an auto-wrap policy, CPU offload, DDP instead). `--epochs 1` "
              "(its default is 10) and `--batch-size 320` (its default is 64): with the "
              "stand-in's 1280 training samples each rank takes 2 steps, so Adadelta steps "
              "from its own state once (10 steps cost 7 s more CPU time; most of the run is "
              "three interpreters and eight DataLoader workers, which no flag of the "
              "tutorial changes). It listens on its fixed MASTER_PORT, 12355.",
    ),
)


# --- torch.distributed.pipelining (wp-corpus2) -----------------------------------------------
CORPUS += (
    Program(
        name="pipelining_tutorial",
        title="Introduction to Distributed Pipeline Parallelism (tutorial, torchrun, 2 ranks)",
        repo=TUTORIALS,
        files=(SourceFile("intermediate_source/pipelining_tutorial.rst",
                          "2662ccacff76e7210d9a02a836fce7381a8e7294", "pipelining_tutorial.rst",
                          10620, "7e1f40c658bbccedb67ca107e1311ed5e4539da6162d1bc7ae57a0a2244d11d3"),),
        licence=BSD3_TUTORIALS,
        entry="pipelining_tutorial.rst",
        launch=TORCHRUN_2,
        exercises="`torch.distributed.pipelining` on two ranks: `init_process_group()` with "
                  "its default backend and `new_group()` for the pipeline, a Transformer (8 "
                  "`TransformerDecoderLayer`s) cut by hand into two `PipelineStage`s on "
                  "cuda:0 and cuda:1 (`del model.layers[...]`, `model.output = None`), "
                  "`model.to(device)` after the stage is built, `ScheduleGPipe` over 4 "
                  "micro-batches: activations sent from cuda:0 to cuda:1, the cross-entropy "
                  "loss on the last stage, gradients sent back, the per-micro-batch losses "
                  "returned on rank 1",
        compare_note="no CPU run: each rank builds the whole model from its own unseeded "
                     "generator and keeps half, the decoder layers' dropout is on (training "
                     "mode) and nothing is optimized, so no replay can draw the same numbers; "
                     "checked: both ranks hold their stage on their own GPU, and rank 1 prints "
                     "the 4 micro-batches' losses as GPU tensors on cuda:1, each near ln(10000) "
                     "= 9.21 as an untrained 10000-word model's must be",
        expect_stdout=(r"^losses: \[" + ", ".join(
            [r"tensor\((?:9\.[0-9]+|10\.[0-4][0-9]*), device='cuda:1', "
             r"grad_fn=<NllLossBackward0>\)"] * 4) + r"\]$",),
        gpus_used=2,
        ranks=Ranks(world=2, trains=False),
        timeout=600.0,
        notes="The tutorial is reStructuredText: its program is its five `.. code:: python` "
              "blocks, which the runner writes, in order and dedented, to "
              "pipelining_tutorial.py, the file the tutorial runs with `torchrun --nnodes 1 "
              "--nproc_per_node 2 pipelining_tutorial.py` (here --standalone, as the other "
              "torchrun programs). Its sizes are fixed (32 x 500 tokens, 3.7 TFLOP for its "
              "one step); it has no flags.",
    ),
)

# --- a 2-D mesh from PyTorch's own training platform: torchtitan (issue 19) --------------------
TORCHTITAN = "torchtitan==0.2.2"
# What both torchtitan runs share: the debug Llama 3 from one seed checkpoint, fp32, 3 steps of
# 64 tokens, the loss printed at each.
TITAN_RUN = (*datagen.TITAN_MODEL, "--training.steps", "3", "--training.seq_len",
             str(datagen.TITAN_SEQ_LEN), "--metrics.log_freq", "1", "--checkpoint.enable",
             "--checkpoint.initial_load_path", datagen.TITAN_SEED_STEP,
             "--checkpoint.load_only")
CORPUS += (
    Program(
        name="torchtitan_llama3_2d",
        title="torchtitan: the debug Llama 3 on a 2-D mesh (FSDP2 x tensor parallelism, 4 GPUs)",
        repo="pytorch/torchtitan",
        files=(),
        module="torchtitan.train",
        package=TORCHTITAN,
        entry="",
        licence="BSD-3-Clause (pytorch/torchtitan LICENSE, (c) Meta Platforms, Inc. and "
                "affiliates; from the package registry, nothing of it committed)",
        launch=("torchrun", "--standalone", "--nproc-per-node", "4"),
        argv=(*TITAN_RUN, "--parallelism.data_parallel_shard_degree", "2",
              "--parallelism.tensor_parallel_degree", "2", "--training.local_batch_size", "1"),
        cpu_launch=("torchrun", "--standalone", "--nproc-per-node", "1"),
        cpu_argv=(*TITAN_RUN, "--training.local_batch_size", "2"),
        env=(("HF_HOME", "hf"),),  # the datasets library's cache, in the run's folder
        data="torchtitan_assets",
        machine_gpus=4,
        reference_gpus=1,
        exercises="PyTorch's own training platform, unmodified, with its defaults for a 2-D "
                  "mesh: `init_device_mesh(\"cuda\", (2, 2))` (dp_shard x tp), the model "
                  "built on the meta device, tensor parallelism (`parallelize_module`: "
                  "column/row-wise attention and feed-forward, sequence-parallel norms, "
                  "loss parallelism on the vocabulary-sharded output), FSDP2 `fully_shard` "
                  "over the dp dimension, selective activation checkpointing, SDPA attention, "
                  "a seed checkpoint loaded into DTensor shards "
                  "(`torch.distributed.checkpoint`), `clip_grad_norm_` over 2-D DTensors, "
                  "AdamW with warm-up, torchdata's stateful data loader split by dp rank",
        compare=Compare(rf"loss:\s+({FLOAT})\s+\S*grad_norm:\s+({FLOAT})", rtol=1e-4,
                        until=r"Training completed"),
        compare_note="torchtitan refuses a CPU run (it sets a CUDA device), so the reference "
                     "is the same program unparallelized on one simulated GPU (which computes "
                     "with the CPU's kernels), torchtitan's own way to check a parallelism: "
                     "both runs load one seed checkpoint (made by torchtitan on one GPU, "
                     "`--checkpoint.create_seed_checkpoint`), the one process takes as a batch "
                     "of 2 the two sequences the two dp ranks take one each (two documents of "
                     "exactly 64 tokens, word-level tokenizer), fp32 parameters; compared: "
                     "rank 0's loss and gradient norm at each of the 3 steps, rtol 1e-4 (the "
                     "losses agree to all 5 printed decimals; the norms to the 4th, as the "
                     "CPU's fp32 norm of a whole 2048x256 gradient loses 9e-5 where the "
                     "sharded norms lose less: the gradients themselves agree to 1e-9); the 4 "
                     "ranks must also start and end with the same (gathered) parameters",
        expect_stdout=(r"Building device mesh with parallelism: pp=1, dp_replicate=1, "
                       r"dp_shard=2, cp=1, tp=2,",
                       r"Applied Tensor Parallelism to the model",
                       r"Applied selective activation checkpointing to the model",
                       r"Applied FSDP to the model",
                       r"Training completed"),
        gpus_used=4,
        ranks=Ranks(world=4),
        timeout=300.0,
        notes="torchtitan's tokenizer and test text (tests/assets/, not in its wheel) are "
              "generated into the run's folder (datagen.torchtitan_assets), with the seed "
              "checkpoint. 0.2.2 is the newest release that runs on torch 2.13 (0.3.0 calls "
              "`torch.distributed.set_timeout`); torchtitan imports Triton (its MoE kernels), "
              "which the test extra installs (import only: nothing compiles). Its sizes come "
              "from its own flags (3 steps, 64-token sequences, the debug model).",
    ),
)

# torchtitan's own checkpoint test (tests/integration_tests: train with checkpoints, then train
# again from one): 4 steps of FSDP2 over 2 GPUs from the seed checkpoint, the full training
# state (model, optimizer, learning-rate schedule, data loader, step) saved at step 2 with
# `dcp.async_save`, then a second launch loading step 2 with `dcp.load` and taking steps 3
# and 4 again.
TITAN_RESUME = (*datagen.TITAN_MODEL, "--training.steps", "4", "--training.seq_len",
                str(datagen.TITAN_SEQ_LEN), "--metrics.log_freq", "1", "--checkpoint.enable",
                "--checkpoint.initial_load_path", datagen.TITAN_SEED_STEP,
                "--checkpoint.interval", "2", "--checkpoint.async_mode", "async")
CORPUS += (
    Program(
        name="torchtitan_llama3_resume",
        title="torchtitan: the debug Llama 3 with FSDP2 (2 GPUs), an async distributed "
              "checkpoint at step 2, then a second launch resuming from it",
        repo="pytorch/torchtitan",
        files=(),
        module="torchtitan.train",
        package=TORCHTITAN,
        entry="",
        licence="BSD-3-Clause (pytorch/torchtitan LICENSE, (c) Meta Platforms, Inc. and "
                "affiliates; from the package registry, nothing of it committed)",
        launch=TORCHRUN_2,
        argv=(*TITAN_RESUME, "--parallelism.data_parallel_shard_degree", "2",
              "--training.local_batch_size", "1"),
        cpu_launch=("torchrun", "--standalone", "--nproc-per-node", "1"),
        cpu_argv=(*TITAN_RESUME, "--training.local_batch_size", "2"),
        relaunch=("--checkpoint.load_step", "2"),
        env=(("HF_HOME", "hf"),),
        data="torchtitan_assets",
        reference_gpus=1,
        exercises="`torch.distributed.checkpoint` with FSDP2, as PyTorch's training platform "
                  "uses it, unmodified: the seed checkpoint loaded into `fully_shard`'s "
                  "DTensor shards (`dcp.load`), the whole training state (model and AdamW "
                  "state as DTensors through `get_state_dict`, the learning-rate scheduler, "
                  "torchdata's stateful loader, the step) saved at step 2 by `dcp.async_save` "
                  "over a gloo group of its own (staged to the host, written by a thread while "
                  "training goes on), the last step's model saved with `dcp.save`; a second "
                  "torchrun in the same folder loading step 2 (`--checkpoint.load_step 2`) "
                  "with `dcp.load`/`set_state_dict` and training steps 3 and 4 again",
        compare=Compare(rf"loss:\s+({FLOAT})\s+\S*grad_norm:\s+({FLOAT})", rtol=1e-4,
                        until=r"Training completed"),
        compare_note="as torchtitan_llama3_2d: the reference is the same two launches "
                     "unparallelized on one simulated GPU (batch 2 = the two dp ranks' "
                     "sequences); compared: rank 0's loss and gradient norm at each step of "
                     "both launches (4 + 2), rtol 1e-4. The second launch checks itself too: "
                     "its steps 3 and 4 must print the first launch's numbers and end with "
                     "its final parameters (bit for bit), which holds only if the step-2 "
                     "checkpoint held the whole training state",
        expect_stdout=(r"Building device mesh with parallelism: pp=1, dp_replicate=1, "
                       r"dp_shard=2, cp=1, tp=1,",
                       r"Applied FSDP to the model",
                       r"Saving the checkpoint \(or staging if async is enabled\)",
                       r"Loading the checkpoint from \S*step-2\.",
                       r"Training completed"),
        gpus_used=2,
        ranks=Ranks(world=2),
        timeout=420.0,
        notes="Two torchruns in one folder (`relaunch`): the first saves outputs/checkpoint/"
              "step-2 (async) and step-4 (the model only, torchtitan's default for the last "
              "step); the second loads step 2. Sizes from torchtitan's own flags, as "
              "torchtitan_llama3_2d.",
    ),
)

# --- CUDA graphs (issue 29) ---------------------------------------------------------------------
MIT_JINO = "MIT (JINO-ROHIT/llm-inference-techniques LICENSE, © 2026 JINO ROHIT)"
CORPUS += (
    Program(
        name="cuda_graphs_whole_network",
        title="CUDA graphs: whole-network capture (PyTorch's CUDA notes' example, as a script)",
        repo="JINO-ROHIT/llm-inference-techniques",
        files=(SourceFile("supplementary/02_cuda_graphs/01_whole_network.py",
                          "27582ed32692ee3767d5097cfe686dadd3962ba8", "01_whole_network.py",
                          1420, "8ff6cd40b65a590205a3f478d37560ea278bdb7238822444818294bcfe6bd17c"),),
        licence=MIT_JINO,
        entry="01_whole_network.py",
        exercises="`torch.cuda.graph` capture of a whole training step (forward with dropout, "
                  "MSE loss, backward into `.grad` made in the capture, SGD's step) after a "
                  "warm-up on a side stream (`torch.cuda.Stream`, `wait_stream`), then 10 "
                  "replays on new data copied into the static tensors (N=640, 4096-2048-1024)",
        compare_note="no CPU run: it hard-codes `cuda` and CUDA graphs, and prints nothing; "
                     "checked: it runs to its end on a simulated GPU (a host sync in the "
                     "capture, or a capture the simulation could not replay, would end it in "
                     "CUDA's error). tests/test_cuda_graphs.py runs the same example at smaller "
                     "sizes and compares each replay's loss and the final parameters with the "
                     "same training run eagerly on the CPU: equal, bit for bit",
        gpus_used=1,
        notes="The notes' whole-network example (docs/source/notes/cuda.rst, 'Whole-network "
              "capture') with `import torch` and one comment of its author's; the notes' "
              "partial-network and AMP examples are in tests/test_cuda_graphs.py.",
    ),
)

# PyTorch's "CUDA semantics" notes (docs/source/notes/cuda.rst): their examples, each block kept
# byte for byte, run as the notes' reader runs them, printing what the notes say of them.
PYTORCH = "pytorch/pytorch"
NOTES = "docs/source/notes/cuda.rst"
NOTES_COMMIT = "68e217b9e71fcecbd34d831dd3e3e5a4ea9028fd"
BSD3_PYTORCH = "BSD-3-Clause (pytorch/pytorch LICENSE, © Facebook, Inc. and its affiliates)"


# --- torch.distributed.checkpoint with FSDP1 (issue 29) -------------------------------------------
CORPUS += (
    Program(
        name="dcp_recipe",
        title="Getting Started with Distributed Checkpoint (DCP recipe, FSDP1, mp.spawn, "
              "2 ranks)",
        repo=TUTORIALS,
        files=(SourceFile("recipes_source/distributed_checkpoint_recipe.rst",
                          "0e52e075d53494c325e0d8cf7175537d7ad02e6d",
                          "distributed_checkpoint_recipe.rst", 14241,
                          "90b778ad9678642d27983bd689aab4da2e3231b07e0e7c4cb1b724525816a200"),),
        licence=BSD3_TUTORIALS,
        entry="distributed_checkpoint_recipe.rst",
        rst_blocks=1,
        standins=(),
        exercises="`torch.distributed.checkpoint` with FSDP version 1: `FSDP(ToyModel())` on "
                  "each rank's GPU, one Adam step, an `AppState` (`Stateful`) whose "
                  "`get_state_dict` gives the model's and the optimizer's sharded state dicts "
                  "(ShardedTensors, FQNs managed), `dcp.save` writing one file per rank and "
                  "the metadata",
        compare_note="the CPU run is a replay (references.dcp_recipe): each rank's ToyModel "
                     "and batch from the seed its process started from, FSDP1's model made of "
                     "rank r's r-th shard, one Adam step on the mean of the ranks' gradients; "
                     "compared: the initial and final parameters (the observer gathers the "
                     "flat parameter's shards); the ranks must start and end equal, and the "
                     "checkpoint, read back whole with DCP in one process, hold rank 0's "
                     "final parameters",
        expect_stdout=(r"^Running fsdp checkpoint example on 2 devices\.$",
                       r"^Running basic FSDP checkpoint saving example on rank 0\.$",
                       r"^Running basic FSDP checkpoint saving example on rank 1\.$"),
        gpus_used=2,
        own_network=True,
        ranks=Ranks(world=2, checkpoint="checkpoint", checkpoint_key="app.model",
                    replay="dcp_recipe"),
        timeout=300.0,
        notes="Its program is the recipe's first python block, the save example. The second, "
              "its load example, raises DCP's `Missing key in checkpoint state_dict: "
              "model.net1.weight` on any device: it loads keys `model` and `optimizer` from the "
              "checkpoint the first saved under `app`; the third, loading into a plain model "
              "without a process group, misses `model.net1.weight` the same way. It listens "
              "on its fixed MASTER_PORT, 12355, and writes checkpoint/ in the run's folder.",
    ),
    Program(
        name="dcp_async_recipe",
        title="Asynchronous Saving with Distributed Checkpoint (DCP async recipe, FSDP1, "
              "mp.spawn, 2 ranks)",
        repo=TUTORIALS,
        files=(SourceFile("recipes_source/distributed_async_checkpoint_recipe.rst",
                          "51a9b619e28cfce594a14d40117583ad4bea34c4",
                          "distributed_async_checkpoint_recipe.rst", 12218,
                          "4c94c30e0ce2017833ad38ccc89dddd8cb03ef8483a92d333acf5f39770d5ba8"),),
        licence=BSD3_TUTORIALS,
        entry="distributed_async_checkpoint_recipe.rst",
        rst_blocks=1,
        standins=(),
        exercises="FSDP version 1 and Adam from `mp.spawn` with `init_process_group(\"nccl\")`, "
                  "then `dcp.async_save`, which refuses a process group without a CPU backend "
                  "(an NCCL-only group: the NCCL group on simulated GPUs says it has CUDA's "
                  "backend alone, as NCCL's does)",
        compare_note="no CPU run: the recipe as stored ends in torch's own error on any device "
                     "with torch 2.13 (async_save needs 'cpu:gloo,cuda:nccl'; the recipe's "
                     "`AppState.state_dict` also names module globals `model` and `optimizer` "
                     "that do not exist, and torch 2.13 cannot stage FSDP1's ShardedTensors for "
                     "async_save); checked: the ranks took their first FSDP1 step on their own "
                     "GPUs, from and to the same (gathered) parameters, and the error is "
                     "torch's",
        expect_stdout=(r"^Running async checkpoint example on 2 devices\.$",
                       r"^Running basic FSDP checkpoint saving example on rank 1\.$"),
        expect_error=(r"^ProcessRaisedException: AssertionError: A CPU backend must be enabled "
                      r"for async save; try initializing process group with "
                      r"'cpu:gloo,cuda:nccl'$"),
        expect_error_at="distributed_async_checkpoint_recipe.py:101",  # its mp.spawn
        gpus_used=2,
        own_network=True,
        ranks=Ranks(world=2),
        timeout=300.0,
        notes="Its program is the recipe's first python block (async_save); its second "
              "(`StorageWriter(cached_state_dict=True)`) imports the abstract `StorageWriter`, "
              "which cannot be instantiated. DCP with FSDP2 and a 'cpu:gloo,cuda:nccl' group "
              "(async_save and load) is tested in tests/test_simulated_dcp.py.",
    ),
)


def _notes(local: str, chars: int, sha256: str, after: str) -> SourceFile:
    return SourceFile(NOTES, NOTES_COMMIT, local, chars, sha256, excerpt=after)


_DEVICES = ("x", "y", "a", "b", "b2", "c", "z", "d", "e", "f")
_SAME = "print('B == torch.sum(A):', torch.allclose(B.cpu(), A.cpu().sum()))\n"

CORPUS += (
    Program(
        name="notes_cuda_devices",
        title="CUDA semantics (PyTorch notes): devices and the torch.cuda.device context",
        repo=PYTORCH,
        files=(_notes("devices.rst", 1240,
                      "51b90d6ba53cb9f4835cb4e2d072c1c35c4c2d32fcfe839a0600dd2370ae2f3c",
                      "Below you can find a small example showcasing this::"),
               _notes("device_context.rst", 212,
                      "1daa7d2545fd39dcdbc43e540c653c96ca6f4801771fa28893f425c45910f4cf",
                      "on, the best practice is to use a :any:`torch.cuda.device` context "
                      "manager.")),
        licence=BSD3_PYTORCH,
        entry="devices.rst",
        prelude="import torch",
        steps=("".join(f"print('{n}.device is', repr({n}.device))\n" for n in _DEVICES),
               "print('current device after the context:', torch.cuda.current_device())"),
        exercises="`torch.device('cuda')`/`'cuda:0'`/`'cuda:2'`, `with torch.cuda.device(1):` "
                  "choosing where `device=cuda`, `.cuda()` and `.to(device=cuda)` place tensors, "
                  "an op's result on its operands' GPU whatever the current device, "
                  "`.cuda(cuda2)`",
        compare_note="no CPU run: the notes use three GPUs by name; checked: each tensor's "
                     "device is the one the notes' comments give",
        expect_stdout=(*(rf"^{n}\.device is device\(type='cuda', index=0\)$" for n in "xyz"),
                       *(rf"^{n}\.device is device\(type='cuda', index=1\)$"
                         for n in ("a", "b", "b2", "c")),
                       *(rf"^{n}\.device is device\(type='cuda', index=2\)$" for n in "def"),
                       r"^Outside device is 0\nInside device is 1\nOutside device is still 0\n"
                       r"current device after the context: 0\n",),
        gpus_used=3,
        machine_gpus=3,
        notes="The notes' first example names GPU 2, so it runs on three simulated GPUs.",
    ),
    Program(
        name="notes_cuda_streams",
        title="CUDA semantics (PyTorch notes): asynchronous execution, events and streams",
        repo=PYTORCH,
        files=(_notes("event_timing.rst", 311,
                      "76ed9013d5eb8b2f03c2366176c6e9c24f1cacdf589f9914280a57b398e3cf31",
                      "to record times as following::"),
               _notes("streams_incorrect.rst", 266,
                      "a5f74188f2cbb36076a2d2746575d14c7098b41bb23f5a3c5d8fef73ddf91d34",
                      "used.  For example, the following code is incorrect::"),
               _notes("streams_fixed.rst", 293,
                      "d99ab7d516f8c2e0db27a5989be503dd823579319ec6b5937504509501130904",
                      "ensure proper synchronization.  The fixed version of this example is::"),
               _notes("streams_no_read_dependency.rst", 285,
                      "6719f2ab892a391685187abce0ea26f00f991cb007d7f38d7e3e0f20d300a421",
                      "read dependency, e.g., as seen in this example::")),
        licence=BSD3_PYTORCH,
        entry="event_timing.rst",
        prelude="import torch",
        steps=("print('elapsed_time_ms:', type(elapsed_time_ms).__name__, "
               "elapsed_time_ms >= 0)",
               "print('s is a new stream:', s.stream_id != torch.cuda.default_stream().stream_id)"
               "\n" + _SAME,
               _SAME + "print('A in use on s:', torch.cuda.memory_stats()"
               "['active_bytes.all.current'] >= A.nbytes)",
               "print('A written on s:', A.device, bool(A.abs().sum() > 0))"),
        exercises="`torch.cuda.Event(enable_timing=True)`, `record()`, `synchronize()`, "
                  "`elapsed_time`; `torch.cuda.Stream()`, `with torch.cuda.stream(s):`, "
                  "`s.wait_stream(torch.cuda.default_stream(cuda))`, `A.record_stream(s)`",
        compare_note="no CPU run: the notes' examples use cuda unconditionally; checked: each "
                     "runs, the side stream is another stream than the default, sum(A) is "
                     "the sum of A (a simulated GPU computes in program order, so the "
                     "incorrect example gives what its fixed version gives: on a GPU its "
                     "result is undefined), A written on the side stream",
        expect_stdout=(r"^elapsed_time_ms: float True$",
                       r"^s is a new stream: True\nB == torch.sum\(A\): True\n"
                       r"B == torch.sum\(A\): True\nA in use on s: True\n"
                       r"A written on s: cuda:0 True\n",),
    ),
    Program(
        name="notes_cuda_backward_streams",
        title="CUDA semantics (PyTorch notes): stream semantics of backward passes",
        repo=PYTORCH,
        files=(_notes("backward_streams.rst", 1056,
                      "c6256fcd8838ff1778df467fa764df0be006e4609e45e7f9d7e37abd2743fa2b",
                      "have the same stream-semantics relationship as any group of ops::"),
               _notes("backward_bc_note.rst", 116,
                      "2e2585e24b9fe1324127438bf3f3e8330cb50f6ed7c36c7c063dd6d003463094",
                      "and ``use grads`` are in different stream contexts, you must sync the "
                      "streams::")),
        licence=BSD3_PYTORCH,
        entry="backward_streams.rst",
        prelude=("import torch\n"
                 "w = torch.full((3,), 2.0, device='cuda', requires_grad=True)\n"
                 "loss = (w + w).sum()  # d loss / d w = 2; nothing saved: backward again\n"
                 "def use_grads():\n"
                 "    print('w.grad:', w.grad.tolist(), w.grad.device)\n"),
        pseudo=(("use grads", "use_grads()"),),
        steps=("use_grads()", ""),
        exercises="`loss.backward()` and `loss.backward(gradient=...)` inside "
                  "`with torch.cuda.stream(s):`, `torch.cuda.current_stream().wait_stream(s)`, "
                  "`s.wait_stream(torch.cuda.current_stream())`, "
                  "`initial_grad.record_stream(s)`",
        compare_note="no CPU run: the notes use cuda unconditionally; checked: the gradients "
                     "accumulate 2 per backward pass (the unsafe patterns give the safe ones' "
                     "values: a simulated GPU computes in program order)",
        expect_stdout=(r"\A" + "".join(rf"w\.grad: \[{v}, {v}, {v}\] cuda:0\n"
                                       for v in ("2.0", "4.0", "6.0", "12.0", "14.0"))
                       + r"\Z",),
        notes="The notes write `use grads` for the code that reads the gradients; the prelude "
              "defines a `loss` with a graph that stays (no saved tensors are freed, so it may "
              "be backpropagated again, as the notes do) and `use_grads()`, which prints them.",
    ),
    Program(
        name="notes_cuda_best_practices",
        title="CUDA semantics (PyTorch notes): device-agnostic code and new_* methods",
        repo=PYTORCH,
        files=(_notes("agnostic_argparse.rst", 423,
                      "31ba798fa522f62fae7dc76758e79d4757886dac2224bb8860fc8f3ca15f85b5",
                      ":class:`torch.device` object that can be used to move tensors to CPU "
                      "or CUDA."),
               _notes("agnostic_tensors.rst", 92,
                      "c27310220def7482bb6ea8bfb1f378482e98d869ae36f324c718fe711c2467a6",
                      "desired device."),
               _notes("agnostic_loader.rst", 114,
                      "a3eed278ef1e96084d063c05c01cac7908f1793585cd988f7bdfcfc690d805cb",
                      "is an example when using a dataloader:"),
               _notes("new_methods.rst", 631,
                      "5d58f5931385b83d163af3a946bb6c62526d44f0a471bbe8eac53bf2e16accbb",
                      "tensors need to be created internally during the forward pass."),
               _notes("like_helpers.rst", 132,
                      "83c6dc25a204a453b95c8c53ee033830f5e46dc5be21ed7c74dba8efcfe6f12b",
                      "also preserve :class:`torch.device` and :class:`torch.dtype` of a "
                      "Tensor).")),
        licence=BSD3_PYTORCH,
        entry="agnostic_argparse.rst",
        prelude=("import torch\n"
                 "Network = lambda: torch.nn.Linear(42, 2)\n"
                 "train_loader = torch.utils.data.DataLoader(torch.randn(8, 42), batch_size=4)\n"),
        steps=("print('args.device:', args.device)",
               "print('x:', x.device, 'net:', next(net.parameters()).device)",
               "print('last batch:', x.device, tuple(x.shape))",
               "",
               "print('ones_like:', y_cpu.device, 'zeros_like:', y_gpu.device)"),
        exercises="`torch.cuda.is_available()` choosing `args.device`, `torch.empty(..., "
                  "device=args.device)`, `Module.to(device=...)`, batches moved with "
                  "`.to(cuda0)`, `new_full`/`new_tensor` keeping the device, "
                  "`ones_like`/`zeros_like`",
        compare_note="no CPU run: `args.device` is cuda where CUDA is available; checked: "
                     "devices and values as the notes show them (torch 2.13 prints "
                     "`-5.` where the notes, printed by an older torch, show `-5.0000`)",
        expect_stdout=(r"\Aargs.device: cuda\nx: cuda:0 net: cuda:0\n"
                       r"last batch: cuda:0 \(4, 42\)\n"
                       r"tensor\(\[\[0.3000, 0.3000\],\n\s+\[0.3000, 0.3000\],\n\s+"
                       r"\[0.3000, 0.3000\]\]\)\n"
                       r"tensor\(\[\[-5., -5.\],\n\s+\[-5., -5.\],\n\s+\[-5., -5.\]\], "
                       r"device='cuda:0'\)\n"
                       r"tensor\(\[\[1, 2, 3\]\]\)\n"
                       r"ones_like: cpu zeros_like: cpu\n",),
        notes="The notes' `Network` and `train_loader` are the prelude's (a Linear layer, a "
              "DataLoader of 8 random rows); the output the notes show inside the `new_*` "
              "block is left out of the code and checked as its printed output. The notes' "
              "`like` example makes `x_gpu` without a device, so both results are on the CPU, "
              "as on a GPU.",
    ),
)

CORPUS += (
    Program(
        name="notes_cuda_memory",
        title="CUDA semantics (PyTorch notes): using custom memory allocators for CUDA",
        repo=PYTORCH,
        files=(_notes("pluggable_allocator.rst", 337,
                      "dac3ce07910f0de0f5903079067ac52f6b2c3d37a45f7997373ec1b99e519a05",
                      "of the alloc/free functions that match the signatures specified above."),),
        licence=BSD3_PYTORCH,
        entry="pluggable_allocator.rst",
        prelude="import torch",
        steps=("",),
        exercises="`torch.cuda.memory.CUDAPluggableAllocator('alloc.so', ...)` and "
                  "`change_current_allocator`: the notes' custom-allocator example",
        compare_note="no CPU run: the example needs a compiled .so calling cudaMalloc; "
                     "checked: devlab's own error naming the allocator and why (no CUDA "
                     "allocator to swap on a simulated GPU), raised at the notes' line",
        expect_error=(r"^NotImplementedError: torch\.cuda\.memory\.CUDAPluggableAllocator "
                      r".* is not simulated by devlab's simulated GPUs"),
        expect_error_at="notes_cuda_memory.py:6",  # its CUDAPluggableAllocator(
        gpus_used=0,
        notes="The notes' second allocator example (an allocation, then the swap) stops at the "
              "same line; its swap, reached with an allocator in hand, raises torch's "
              "`Can't swap an already initialized allocator` (tests/test_simulated_cufft.py). "
              "The section's other statements (the cuFFT plan cache, PYTORCH_CUDA_ALLOC_CONF's "
              "forms) are tested there too.",
    ),
)

BY_NAME: dict[str, Program] = {p.name: p for p in CORPUS}


def get(name: str) -> Program:
    """The corpus entry called `name` (KeyError naming the known ones otherwise)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no program {name!r} in the corpus; known: {sorted(BY_NAME)}") from None
