"""torch's own test, test/test_cuda.py `test_cublas_workspace_explicit_allocation` (pytorch/pytorch;
the versions found through the search index, e.g. index file ids 5954852340 and 55314936),
which torch's CI runs on its CUDA runners. It asserts that the first matrix product on a stream
allocates cuBLAS's workspace from the caching allocator, of

    default_workspace_size = (
        4096 * 2 * 1024 + 16 * 8 * 1024
    )  # :4096:2:16:8  8MiB
    # different size (32 MiB) expected on Hopper GPU
    if torch.cuda.get_device_capability() == (9, 0):
        default_workspace_size = 4096 * 8 * 1024
    ...
    self.assertTrue(abs(check_workspace_size(a) - default_workspace_size) < 524288)

i.e. 8,519,680 bytes (within 512 KiB) on a non-Hopper GPU and 33,554,432 on an H100. The check
below is the test's `check_workspace_size` (its first case, CUBLAS_WORKSPACE_CONFIG unset).
Changed: `torch._C._cuda_clearCublasWorkspaces` is called only where it exists (devlab's
simulated CUDA does not provide it), and the test's `preferred_blas_library("cublas")` line is
left out (CPU torch has no cuBLAS to select).
"""

# ruff: noqa: UP032, B905, F821  (the published code, kept as published)
import os

import torch

a = torch.randn(7, 7, device="cuda", requires_grad=False)


def check_workspace_size(inp):
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    start = torch.cuda.memory_stats()["active_bytes.all.allocated"]
    with torch.no_grad():
        torch.matmul(inp, inp)
    finish = torch.cuda.memory_stats()["active_bytes.all.allocated"]
    return finish - start


os.environ["CUBLAS_WORKSPACE_CONFIG"] = ""
size = check_workspace_size(a)
print("workspace bytes allocated by the first matmul:", size)
report("first_matmul_active_bytes", size)  # noqa: F821
