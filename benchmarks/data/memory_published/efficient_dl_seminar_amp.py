"""The "Efficient Deep Learning Systems" course (mryab/efficient-dl-systems), week 2 seminar,
week02_fast_pipelines/seminar/practice.ipynb at commit e632aa89ca9e6638d52e1b686095e7442faffbb0
(https://github.com/mryab/efficient-dl-systems/blob/e632aa89ca9e6638d52e1b686095e7442faffbb0/week02_fast_pipelines/seminar/practice.ipynb;
read here through a copy in the search index, file id 65825410347). Its AMP section is
PyTorch's AMP recipe at 6144 features, with the notebook's printed output:

    Full precision:
    Total execution time = 0.302 sec
    Max memory used by tensors = 2271 megabytes
    ...
    Half precision: ... Max memory used by tensors = 2063 megabytes
    Mixed precision without scaling: ... Max memory used by tensors = 2327 megabytes
    Mixed precision with scaling: ... Max memory used by tensors = 2535 megabytes

("megabytes" are max_memory_allocated() // 1_000_000.) GPU and torch version not stated (the
notebook's `!nvidia-smi` is commented out; its profiler logs are dated 2026-01-21). The code is
the notebook's, except: each timed loop runs 2 steps of one epoch instead of 3 epochs of 50
(the 50 batches are still made and kept on the GPU), tqdm's trange is range, and the three
float16 sections run only when MEMPUB_FULL=1 (float16 products take minutes on a CPU).
"""

# ruff: noqa: UP032, B905, F821  (the published code, kept as published)
import gc
import os
from time import time

import torch

STEPS = 2
FULL = os.environ.get("MEMPUB_FULL") == "1"

device = torch.device("cuda:0")

start_time = None

batch_size = 512  # Try, for example, 128, 256, 513
in_size = 4096 + 2048
out_size = 4096 + 2048
num_layers = 3
num_batches = 50
epochs = 3


def start_timer():
    global start_time
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    start_time = time()


def end_timer_and_print(local_msg):
    torch.cuda.synchronize()
    end_time = time()
    print("\n" + local_msg)
    print(f"Total execution time = {end_time - start_time:.3f} sec")
    print(
        f"Max memory used by tensors = {torch.cuda.max_memory_allocated() // 1_000_000} megabytes"
    )


def create_model(in_size: int, out_size: int, num_layers: int) -> torch.nn.Module:
    layers = []
    for _ in range(num_layers - 1):
        layers.append(torch.nn.Linear(in_size, in_size))
        layers.append(torch.nn.ReLU())
    layers.append(torch.nn.Linear(in_size, out_size))
    return torch.nn.Sequential(*tuple(layers))


data = [torch.randn(batch_size, in_size, device=device) for _ in range(num_batches)]
targets = [torch.randn(batch_size, out_size, device=device) for _ in range(num_batches)]
loss_fn = torch.nn.MSELoss().to(device)

net = create_model(in_size, out_size, num_layers).to(device)
opt = torch.optim.SGD(net.parameters(), lr=0.001)

start_timer()
for input, target in list(zip(data, targets))[:STEPS]:
    output = net(input)
    loss = loss_fn(output, target)
    loss.backward()
    opt.step()
    opt.zero_grad()  # set_to_none=True here can modestly improve performance
end_timer_and_print("Full precision:")
report("full_peak", torch.cuda.max_memory_allocated())  # noqa: F821

if not FULL:
    raise SystemExit(0)

net = create_model(in_size, out_size, num_layers)
net.half().to(device)
opt = torch.optim.SGD(net.parameters(), lr=0.001)

start_timer()
for input, target in list(zip(data, targets))[:STEPS]:
    output = net(input.half())
    loss = loss_fn(output, target.half())
    loss.backward()
    opt.step()
    opt.zero_grad()
end_timer_and_print("Half precision:")
report("half_peak", torch.cuda.max_memory_allocated())  # noqa: F821

net = create_model(in_size, out_size, num_layers).to(device)
opt = torch.optim.SGD(net.parameters(), lr=0.001)

start_timer()
for input, target in list(zip(data, targets))[:STEPS]:
    with torch.amp.autocast(device_type="cuda", dtype=torch.float16):
        output = net(input)
        assert output.dtype is torch.float16
        loss = loss_fn(output, target)
        assert loss.dtype is torch.float32
    loss.backward()
    opt.step()
    opt.zero_grad()
end_timer_and_print("Mixed precision without scaling:")
report("mixed_noscale_peak", torch.cuda.max_memory_allocated())  # noqa: F821

net = create_model(in_size, out_size, num_layers).to(device)
opt = torch.optim.SGD(net.parameters(), lr=0.001)
scaler = torch.cuda.amp.GradScaler(enabled=True)

start_timer()
for input, target in list(zip(data, targets))[:STEPS]:
    with torch.amp.autocast(device_type="cuda", dtype=torch.float16):
        output = net(input)
        assert output.dtype is torch.float16
        loss = loss_fn(output, target)
        assert loss.dtype is torch.float32
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
end_timer_and_print("Mixed precision with scaling:")
report("mixed_scale_peak", torch.cuda.max_memory_allocated())  # noqa: F821
