"""pytorch/pytorch issue #95668, "Nightly is leaking memory with a simple Linear layer"
(https://github.com/pytorch/pytorch/issues/95668, 2023-02-28): a Linear(1, 1) called once in a
function leaves CUDA memory allocated after the function returns. Reported on torch
2.0.0.dev20230227+cu118, "GPU 0: NVIDIA A10G" (CUDA_MODULE_LOADING set to: LAZY). The script
ends with an assertion whose message is the printed figure:

    AssertionError: (8519680, 0)

i.e. memory_allocated() is 8,519,680 bytes after f() returned, and was 0 before. The bytes are
cuBLAS's workspace, which torch allocates from its caching allocator on a stream's first matrix
product and keeps (4096 * 1024 * 2 + 16 * 1024 * 8 bytes, CUBLAS_WORKSPACE_CONFIG's default
":4096:2:16:8"; PR #85447). The code below is the issue's, with the assertion turned into a
report so that the benchmark goes on.
"""

# ruff: noqa: UP032, B905, F821  (the published code, kept as published)
import torch

device = torch.device("cuda")
start_cuda_memory = torch.cuda.memory_allocated(device)


def f():
    model = torch.nn.Linear(1, 1, device=device)
    b = torch.randn(1, 1, device=device)
    model(b)


f()

torch.cuda.synchronize(device)
cuda_memory = torch.cuda.memory_allocated(device)
print((cuda_memory, start_cuda_memory))
report("allocated_after_f", cuda_memory)  # noqa: F821
