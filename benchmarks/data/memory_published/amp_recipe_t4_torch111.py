"""A check, not a published program: amp_recipe_t4.py as torch 1.11 ran it. There,
`opt.zero_grad()` zeroed the gradients and kept them; since torch 2.0 it sets them to None. This
file is amp_recipe_t4.py with both loops' `opt.zero_grad()` written
`opt.zero_grad(set_to_none=False)`; its figures are compared with the same published ones.

PyTorch's "Automatic Mixed Precision" recipe (recipes/recipes/amp_recipe.py, the version of
the torch 1.11 era), as run on a Tesla T4 and published with its output.

Source of the figures: a README in a public GitHub repository, found through the search
index's find_string (index file id 45979577396; its repository name was not resolved),
"Comparison for training CNN models using Tensor Cores with PyTorch": "GPU: Tesla T4 /
Framework: PyTorch 1.11 / nvidia Driver: 470.57.02 / cuda: 11.4". It quotes the recipe's
training loops ("Sample Code without using Tensor Cores" / "using Tensor Cores") and prints:

    Default precision:
    Total execution time = 7.020 sec
    Max memory used by tensors = 1350681600 bytes

    Mixed precision:
    Total execution time = 2.524 sec
    Max memory used by tensors = 1577232384 bytes

The recipe's code follows unchanged, except: each timed loop runs 2 steps of one epoch
instead of 3 epochs of 50 steps (every step allocates and frees the same tensors, so the peak
is reached by the second step; the 50 batches of data are still made and kept on the GPU),
and the two illustration sections that run 0 epochs are left out (they allocate nothing).
`report` (given by benchmarks/memory_published.py) records a figure for the benchmark.
"""

# ruff: noqa: UP032, B905, F821  (the published code, kept as published)
import gc
import os
import time

import torch

STEPS = 2  # the recipe: `for epoch in range(epochs): for input, target in zip(data, targets)`
# The mixed-precision half runs float16 matrix products, which take minutes on a CPU: it runs
# only when the benchmark is asked for every program (MEMPUB_FULL=1).
FULL = os.environ.get("MEMPUB_FULL") == "1"

start_time = None


def start_timer():
    global start_time
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_max_memory_allocated()
    torch.cuda.synchronize()
    start_time = time.time()


def end_timer_and_print(local_msg):
    torch.cuda.synchronize()
    end_time = time.time()
    print("\n" + local_msg)
    print("Total execution time = {:.3f} sec".format(end_time - start_time))
    print("Max memory used by tensors = {} bytes".format(torch.cuda.max_memory_allocated()))


def make_model(in_size, out_size, num_layers):
    layers = []
    for _ in range(num_layers - 1):
        layers.append(torch.nn.Linear(in_size, in_size))
        layers.append(torch.nn.ReLU())
    layers.append(torch.nn.Linear(in_size, out_size))
    return torch.nn.Sequential(*tuple(layers)).cuda()


batch_size = 512  # Try, for example, 128, 256, 513.
in_size = 4096
out_size = 4096
num_layers = 3
num_batches = 50
epochs = 3

# Creates data in default precision.
# The same data is used for both default and mixed precision trials below.
data = [torch.randn(batch_size, in_size, device="cuda") for _ in range(num_batches)]
targets = [torch.randn(batch_size, out_size, device="cuda") for _ in range(num_batches)]

loss_fn = torch.nn.MSELoss().cuda()

net = make_model(in_size, out_size, num_layers)
opt = torch.optim.SGD(net.parameters(), lr=0.001)

start_timer()
for input, target in list(zip(data, targets))[:STEPS]:
    output = net(input)
    loss = loss_fn(output, target)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)  # torch 1.11's opt.zero_grad()
end_timer_and_print("Default precision:")
report("default_peak", torch.cuda.max_memory_allocated())  # noqa: F821

use_amp = True
if not FULL:
    raise SystemExit(0)

net = make_model(in_size, out_size, num_layers)
opt = torch.optim.SGD(net.parameters(), lr=0.001)
scaler = torch.cuda.amp.GradScaler(enabled=use_amp)

start_timer()
for input, target in list(zip(data, targets))[:STEPS]:
    with torch.cuda.amp.autocast(enabled=use_amp):
        output = net(input)
        loss = loss_fn(output, target)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=False)  # torch 1.11's opt.zero_grad()
end_timer_and_print("Mixed precision:")
report("mixed_peak", torch.cuda.max_memory_allocated())  # noqa: F821
