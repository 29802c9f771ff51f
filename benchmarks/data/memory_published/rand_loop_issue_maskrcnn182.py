"""facebookresearch/maskrcnn-benchmark issue #182, comment by fmassa (2018-11-27)
(https://github.com/facebookresearch/maskrcnn-benchmark/issues/182): "As a basic example (run
in a new interpreter)":

    import torch
    for i in range(10):
        a = torch.rand(1000, 1000, i + 1, device='cuda:0')
        print(torch.cuda.max_memory_allocated(), torch.cuda.max_memory_cached())

"will print" (figures in MiB: the printed code divides nothing, so the run that printed them
divided by 2**20; 4.7001953125 MiB = 4,928,512 bytes):

    4.7001953125 4.875
    12.4501953125 12.625
    20.0751953125 24.125
    ...
    73.4501953125 211.625

GPU not stated; PyTorch of late 2018 (the issue's reporter ran torch-1.0.0a0). The same code,
printing MiB; max_memory_cached is max_memory_reserved's old name.
"""

# ruff: noqa: UP032, B905, F821  (the published code, kept as published)
import torch

for i in range(10):
    a = torch.rand(1000, 1000, i + 1, device='cuda:0')
    print(torch.cuda.max_memory_allocated() / 2**20, torch.cuda.max_memory_reserved() / 2**20)
    if i == 0:
        report("first_peak_allocated", torch.cuda.max_memory_allocated())  # noqa: F821
        report("first_peak_reserved", torch.cuda.max_memory_reserved())  # noqa: F821
report("last_peak_allocated", torch.cuda.max_memory_allocated())  # noqa: F821
report("last_peak_reserved", torch.cuda.max_memory_reserved())  # noqa: F821
