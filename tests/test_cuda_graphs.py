"""CUDA graphs on simulated GPUs (devlab/engine/simulated/cuda/graphs.py): a capture records the ops,
a replay reruns them into the same tensors, host syncs during capture are CUDA's error, and on
a modeled GPU a replay costs one launch.

The examples of PyTorch's CUDA semantics notes (docs/source/notes/cuda.rst, "CUDA Graphs",
pytorch/pytorch@68e217b9) run here as the notes write them, at smaller sizes (N, D_in, H, D_out)
so that the CPU computes them quickly, and are compared with the same training run eagerly on
the CPU: a simulated GPU computes with the CPU's kernels and draws from its generator, so the
values must be equal, not close.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain

import pytest
import torch

import devlab
from devlab.engine.simulated.base import session as _session

N, D_IN, H, D_OUT = 64, 256, 128, 32


def _whole_network(device: str, graphed: bool) -> tuple[list[float], list[torch.Tensor]]:
    """The notes' whole-network capture (warmup, capture of forward, loss, backward and SGD's
    step, 10 replays on new data); eagerly, each replay is one training step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(D_IN, H), torch.nn.Dropout(p=0.2),
                                torch.nn.Linear(H, D_OUT), torch.nn.Dropout(p=0.1)).to(device)
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    static_input = torch.randn(N, D_IN, device=device)
    static_target = torch.randn(N, D_OUT, device=device)

    def step() -> torch.Tensor:
        y_pred = model(static_input)
        loss = loss_fn(y_pred, static_target)
        loss.backward()
        optimizer.step()
        return loss

    losses = _captured_training(step, lambda: None, optimizer, static_input, static_target,
                                graphed)
    return losses, [p.detach().cpu() for p in model.parameters()]


def _captured_training(step: Callable[[], torch.Tensor], after: Callable[[], None],
                       optimizer: torch.optim.Optimizer, static_input: torch.Tensor,
                       static_target: torch.Tensor, graphed: bool) -> list[float]:
    """The notes' pattern around a captured `step`: three eager warm-up steps, the capture
    (graphed) and ten steps on new data copied into the static tensors, each a replay
    (graphed) or `step` run eagerly, then `after` (eager in both); the losses."""
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        step()
        after()
    if graphed:
        g = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            static_loss = step()
    real_inputs = [torch.rand_like(static_input) for _ in range(10)]
    real_targets = [torch.rand_like(static_target) for _ in range(10)]
    losses = []
    for data, target in zip(real_inputs, real_targets, strict=True):
        static_input.copy_(data)
        static_target.copy_(target)
        if graphed:
            g.replay()
        else:
            optimizer.zero_grad(set_to_none=True)
            static_loss = step()
        after()
        losses.append(static_loss.item())
    return losses


def _partial_network(device: str, graphed: bool) -> tuple[list[float], list[torch.Tensor]]:
    """The notes' partial-network capture: three Linear modules through
    make_graphed_callables, data-dependent control flow between them, run eagerly."""
    torch.manual_seed(0)
    module1 = torch.nn.Linear(D_IN, H).to(device)
    module2 = torch.nn.Linear(H, D_OUT).to(device)
    module3 = torch.nn.Linear(H, D_OUT).to(device)
    params = [*module1.parameters(), *module2.parameters(), *module3.parameters()]
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(chain(module1.parameters(), module2.parameters(),
                                      module3.parameters()), lr=0.1)
    x = torch.randn(N, D_IN, device=device)
    h = torch.randn(N, H, device=device, requires_grad=True)
    if graphed:
        module1 = torch.cuda.make_graphed_callables(module1, (x,))
        module2 = torch.cuda.make_graphed_callables(module2, (h,))
        module3 = torch.cuda.make_graphed_callables(module3, (h,))
    real_inputs = [torch.rand_like(x) for _ in range(10)]
    real_targets = [torch.randn(N, D_OUT, device=device) for _ in range(10)]
    losses = []
    for data, target in zip(real_inputs, real_targets, strict=True):
        optimizer.zero_grad(set_to_none=True)
        tmp = module1(data)
        tmp = module2(tmp) if tmp.sum().item() > 0 else module3(tmp)
        loss = loss_fn(tmp, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in params]


def _amp(device: str, graphed: bool) -> tuple[list[float], list[torch.Tensor]]:
    """The notes' usage with torch.cuda.amp: forward, loss and the scaled backward captured,
    GradScaler's step and update run eagerly after each replay (float16 autocast on both)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(D_IN, H), torch.nn.Dropout(p=0.2),
                                torch.nn.Linear(H, D_OUT), torch.nn.Dropout(p=0.1)).to(device)
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device)
    static_input = torch.randn(N, D_IN, device=device)
    static_target = torch.randn(N, D_OUT, device=device)

    def forward_backward() -> torch.Tensor:
        with torch.autocast(device, dtype=torch.float16):
            y_pred = model(static_input)
            loss = loss_fn(y_pred, static_target)
        scaler.scale(loss).backward()
        return loss


    def scaler_step() -> None:
        scaler.step(optimizer)
        scaler.update()

    losses = _captured_training(forward_backward, scaler_step, optimizer, static_input,
                                static_target, graphed)
    return losses, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("example", [_whole_network, _partial_network, _amp],
                         ids=["whole-network", "partial-network", "amp"])
def test_notes_examples_give_the_cpu_runs_values(no_simulation, example) -> None:
    cpu_losses, cpu_params = example("cpu", graphed=False)
    devlab.simulated.start(1)
    losses, params = example("cuda", graphed=True)
    assert losses == cpu_losses
    assert len(set(losses)) > 1  # each replay computed on its own data
    for p, q in zip(params, cpu_params, strict=True):
        assert torch.equal(p, q)


def test_notes_first_example_prints_6_then_8(no_simulation) -> None:
    devlab.simulated.start(1)
    g = torch.cuda.CUDAGraph()
    static_input = torch.empty((5,), device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            static_output = static_input * 2
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        static_output = static_input * 2
    static_input.copy_(torch.full((5,), 3, device="cuda"))
    g.replay()
    assert repr(static_output) == "tensor([6., 6., 6., 6., 6.], device='cuda:0')"
    static_input.copy_(torch.full((5,), 4, device="cuda"))
    g.replay()
    assert repr(static_output) == "tensor([8., 8., 8., 8., 8.], device='cuda:0')"


def test_replay_equals_eager_for_new_static_inputs(no_simulation) -> None:
    devlab.simulated.start(1)
    torch.manual_seed(1)
    w = torch.randn(16, 8, device="cuda")
    b = torch.randn(8, device="cuda")
    x = torch.randn(4, 16, device="cuda")

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.nn.functional.gelu(x @ w + b)
        return h.softmax(-1), h.t().contiguous()[:3]  # a view and a copy of it among outputs

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, part = f(x)
    assert "aten::mm" in g.recorded_ops or "aten::addmm" in g.recorded_ops
    for seed in range(3):
        torch.manual_seed(seed)
        x.copy_(torch.randn(4, 16, device="cuda"))
        b.mul_(2)  # an input the graph reads, changed in place
        g.replay()
        want_out, want_part = f(x)
        assert torch.equal(out, want_out) and torch.equal(part, want_part)


def test_capture_runs_nothing_until_replay(no_simulation) -> None:
    devlab.simulated.start(1)
    w = torch.ones(3, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        w.add_(1)
        y = w * 10
    assert w.tolist() == [1.0, 1.0, 1.0]  # the GPU never ran the captured add_
    g.replay()
    assert w.tolist() == [2.0, 2.0, 2.0] and y.tolist() == [20.0, 20.0, 20.0]
    g.replay()
    assert w.tolist() == [3.0, 3.0, 3.0] and y.tolist() == [30.0, 30.0, 30.0]


def test_capture_gives_back_its_random_draws(no_simulation) -> None:
    devlab.simulated.start(1)
    x = torch.ones(1000, device="cuda")
    torch.manual_seed(0)
    state = torch.cuda.get_rng_state()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = torch.nn.functional.dropout(x, 0.5)
    assert torch.equal(torch.cuda.get_rng_state(), state)
    g.replay()
    first = y.clone()
    g.replay()
    assert not torch.equal(first, y)  # each replay draws a fresh mask, as on a GPU


SYNCS = {
    "item": lambda x: x.sum().item(),
    "cpu": lambda x: x.cpu(),
    "tolist": lambda x: x.tolist(),
    "synchronize": lambda x: torch.cuda.synchronize(),
    "nonzero": lambda x: x.nonzero(),
    "from pageable host memory": lambda x: x.copy_(torch.ones(3)),
    "to the GPU": lambda x: torch.ones(3).cuda(),
}


@pytest.mark.parametrize("sync", list(SYNCS))
def test_a_host_sync_in_capture_is_cudas_error_and_changes_nothing(no_simulation, sync) -> None:
    devlab.simulated.start(1)
    x = torch.ones(3, device="cuda")
    allocated = torch.cuda.memory_allocated()
    modes = torch._C._len_torch_dispatch_stack()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError) as caught:
        with torch.cuda.graph(g):
            x.add_(1)
            y = x * 2  # noqa: F841 - memory made in the failed capture
            SYNCS[sync](x)
    # On a GPU the sync fails, then the capture's end reports the invalidated capture.
    assert str(caught.value).startswith(
        "CUDA error: operation failed due to a previous error during capture\n")
    assert str(caught.value.__context__).startswith(
        "CUDA error: operation not permitted when stream is capturing\n")
    assert isinstance(caught.value, getattr(torch, "AcceleratorError", RuntimeError))
    (note,) = caught.value.__context__.__notes__  # what devlab adds, below CUDA's own text
    assert note.startswith("devlab: ") and "while a CUDA graph is being captured" in note
    del caught, y
    assert x.tolist() == [1.0, 1.0, 1.0]
    assert torch._C._len_torch_dispatch_stack() == modes
    assert not torch.cuda.is_current_stream_capturing()
    assert _session.capture is None
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    del g
    assert torch.cuda.memory_allocated() == allocated
    torch.cuda.synchronize()  # syncs work again


def test_casts_are_captured_and_other_gpus_work_is_devlabs_own_error(no_simulation) -> None:
    devlab.simulated.start(2)
    x = torch.ones(3, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        h = x.half()
    x.fill_(5)
    g.replay()
    assert h.dtype == torch.float16 and h.tolist() == [5.0, 5.0, 5.0]
    # How CUDA orders another GPU's work with a capture is not simulated: devlab says so.
    other = torch.cuda.CUDAGraph()
    with pytest.raises(NotImplementedError) as caught:
        with torch.cuda.graph(other):
            x.mul_(2)
            x.to("cuda:1")
    assert str(caught.value).startswith("capture abandoned: aten::_to_copy on cuda:1 during a "
                                        "CUDA graph capture on cuda:0 is not simulated")
    assert "torch.cuda.device(1)" in str(caught.value)
    assert x.tolist() == [5.0, 5.0, 5.0] and _session.capture is None
    # torch.cuda.graph's default capture stream is on the GPU of the first capture (cuda:0):
    # GPU 1's work is captured on a stream of GPU 1, as on CUDA.
    assert torch.cuda.graph.default_capture_stream.device == torch.device("cuda", 0)
    with torch.cuda.device(1):
        on1 = torch.ones(3, device="cuda")
        with torch.cuda.graph(other, stream=torch.cuda.Stream()):
            on1.add_(1)
    other.replay()
    assert on1.tolist() == [2.0, 2.0, 2.0]


def test_notes_multistream_capture_branches_out_and_rejoins(no_simulation) -> None:
    devlab.simulated.start(1)
    x = torch.ones(4, device="cuda")
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x + 1
        s.wait_stream(torch.cuda.current_stream())  # branches out from the capturing stream
        with torch.cuda.stream(s):
            z = y * 3
        torch.cuda.current_stream().wait_stream(s)  # rejoins it before the capture ends
    x.fill_(2)
    g.replay()
    assert z.tolist() == [9.0] * 4


MiB = 1 << 20


def _pool_segments(pool_id: tuple[int, int]) -> list[dict]:
    return [s for s in torch.cuda.memory_snapshot() if s["segment_pool_id"] == pool_id]


def test_capture_allocates_from_the_graphs_private_pool(no_simulation) -> None:
    """The notes' "Graph memory management": the capture's tensors come from the graph's own
    segments; a block the program lets go of stays reserved in that pool, reused by it alone;
    reset() releases the pool, whose segments the next empty_cache() frees."""
    devlab.simulated.start(1, model="T4")
    x = torch.ones(256, 1024, device="cuda")  # 1 MiB, in the device's small pool
    torch.cuda.set_stream(torch.cuda.Stream())
    a0, r0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x * 2  # 1 MiB: a 2 MiB segment of the graph's small pool, split
        z = (y + 1).sum()  # y + 1 fills the segment; z (512 B) needs a second one
    pool = g.pool()
    assert pool[0] > 0 and pool[1] == 0  # a graph's own pool: the first number set
    segs = _pool_segments(pool)
    assert [s["total_size"] for s in segs] == [2 * MiB, 2 * MiB]
    assert all(s["segment_type"] == "small" for s in segs)
    # y + 1 died with the capture: its block is back in the pool, reserved, not allocated
    assert torch.cuda.memory_allocated() - a0 == MiB + 512
    assert torch.cuda.memory_reserved() - r0 == 4 * MiB
    stats = torch.cuda.memory_stats()
    assert stats["segment.small_pool.current"] == 3  # x's segment and the pool's two
    del y
    assert torch.cuda.memory_allocated() - a0 == 512
    w = torch.empty(MiB, dtype=torch.uint8, device="cuda")  # outside any capture
    assert _pool_segments((0, 0))[-1]["allocated_size"] == MiB  # not the pool's free block
    torch.cuda.empty_cache()  # a live graph's pool keeps its segments
    assert [s["total_size"] for s in _pool_segments(pool)] == [2 * MiB, 2 * MiB]
    x.fill_(3)
    g.replay()
    assert z.item() == 7 * 256 * 1024
    g.reset()
    assert [s["total_size"] for s in _pool_segments(pool)] == [2 * MiB, 2 * MiB]  # until...
    torch.cuda.empty_cache()  # ...the pool's unused segment goes; z still holds the other
    assert [s["allocated_size"] for s in _pool_segments(pool)] == [512]
    del z, w
    torch.cuda.empty_cache()
    assert _pool_segments(pool) == []
    assert torch.cuda.memory_allocated() == a0
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()


def test_captures_share_a_pool_through_pool_and_graph_pool_handle(no_simulation) -> None:
    """The notes' "Sharing memory across captures": a second capture given the first's pool
    (or both a graph_pool_handle()) allocates from the same segments, reusing what the first
    freed; the pool lives until every graph sharing it is reset."""
    devlab.simulated.start(1, model="T4")
    x = torch.ones(64, 1024, device="cuda")  # 256 KiB
    torch.cuda.set_stream(torch.cuda.Stream())
    handle = torch.cuda.graph_pool_handle()
    assert handle[0] == 0 and handle[1] > 0
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1, pool=handle):
        y1 = (x + 1) * 2  # x + 1 freed: its 256 KiB return to the pool
    with torch.cuda.graph(g2, pool=g1.pool()):
        y2 = (y1 + 1) * 2
    assert g1.pool() == g2.pool() == handle
    segs = _pool_segments(handle)
    assert len(segs) == 1 and segs[0]["total_size"] == 2 * MiB  # one segment serves both
    assert segs[0]["allocated_size"] == 2 * x.nbytes  # y1 and y2
    g1.replay()
    g2.replay()
    assert y2.tolist()[0][0] == ((1 + 1) * 2 + 1) * 2
    g1.reset()
    del y1, y2
    torch.cuda.empty_cache()
    assert len(_pool_segments(handle)) == 1  # g2 still uses the pool
    g2.reset()
    torch.cuda.empty_cache()
    assert _pool_segments(handle) == []


def test_deleting_a_graph_releases_its_pool(no_simulation) -> None:
    devlab.simulated.start(1, model="T4")
    x = torch.ones(1024, 1024, device="cuda")
    torch.cuda.set_stream(torch.cuda.Stream())
    r0 = torch.cuda.memory_reserved()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        (x * 2).sum()
    assert torch.cuda.memory_reserved() > r0
    del g  # CUDAGraph's destructor resets it
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == r0


def test_errors_in_cudas_words(no_simulation) -> None:
    devlab.simulated.start(1)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="Unknown capture error mode. Expected `global`"):
        g.capture_begin(capture_error_mode="strict")
    with pytest.raises(RuntimeError, match="the operation cannot be performed"):
        g.capture_end()
    with pytest.raises(RuntimeError, match=r"Called CUDAGraph::pool\(\) without"):
        g.pool()
    x = torch.ones(2, device="cuda")
    with torch.cuda.graph(g):
        x.add_(1)
    with pytest.raises(RuntimeError, match="already owns a captured graph"):
        g.capture_begin()
    with pytest.raises(NotImplementedError, match="not simulated by devlab"):
        g.raw_cuda_graph()
    other = torch.cuda.CUDAGraph()
    torch.cuda.set_stream(torch.cuda.Stream())  # a capture begins on a non-default stream
    other.capture_begin(pool=g.pool())
    with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
        torch.cuda.CUDAGraph().capture_begin()  # one capture at a time
    assert torch.cuda.is_current_stream_capturing()
    assert torch.cuda.current_stream().is_capturing()
    with pytest.warns(UserWarning, match="The CUDA Graph is empty"):
        other.capture_end()
    assert not torch.cuda.is_current_stream_capturing()


def test_stop_during_capture_leaves_torch_as_it_was(no_simulation) -> None:
    modes = torch._C._len_torch_dispatch_stack()
    devlab.simulated.start(1)
    g = torch.cuda.CUDAGraph()
    torch.cuda.set_stream(torch.cuda.Stream())
    g.capture_begin()
    torch.ones(2, device="cuda").add_(1)
    devlab.simulated.stop()
    assert torch._C._len_torch_dispatch_stack() == modes
    assert _session.capture is None


def test_modeled_replay_costs_one_launch(no_simulation) -> None:
    devlab.simulated.start(1, model="T4")
    x = torch.zeros(1024, device="cuda")

    def work() -> None:
        for _ in range(20):
            x.add_(1)

    eager = devlab.simulated.explain(work)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        work()
    replay = devlab.simulated.explain(g.replay)
    launch = devlab.simulated.model().launch_latency_us * 1e-6
    assert [op.launch for op in eager.ops] == [launch] * 20
    assert [op.launch for op in replay.ops] == [launch] + [0.0] * 19
    # The kernels themselves cost the GPU what they cost eagerly.
    assert [op.gpu for op in replay.ops] == [op.gpu for op in eager.ops]
    assert replay.total == pytest.approx(eager.total - 19 * launch)

    # And on the clock CUDA events read: 20 eager launches outlast one replay.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    work()
    end.record()
    eager_ms = start.elapsed_time(end)
    torch.cuda.synchronize()
    start.record()
    g.replay()
    end.record()
    replay_ms = start.elapsed_time(end)
    assert replay_ms < eager_ms
    assert replay_ms == pytest.approx((launch + sum(op.gpu for op in eager.ops)) * 1e3)
    assert x[0].item() == 80.0  # explain's eager work, its replay, then one of each again


def test_capture_charges_the_gpu_nothing(no_simulation) -> None:
    devlab.simulated.start(1, model="T4")
    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            x.mul_(2)
    done = torch.cuda.Event(enable_timing=True)
    done.record()
    # The GPU's queue did not advance with the captured kernels: it is where the host is.
    assert done.time == pytest.approx(devlab.simulated.modeled_time())


def test_a_capture_on_the_default_stream_is_refused_as_torch_refuses_it(no_simulation) -> None:
    devlab.simulated.start(1)
    x = torch.ones(3, device="cuda")
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="CUDA graphs must be captured on a non-default stream"):
        g.capture_begin()  # on the current stream: the default one
    assert not torch.cuda.is_current_stream_capturing() and _session.capture is None
    with torch.cuda.stream(torch.cuda.Stream()):
        g.capture_begin()
        x.add_(1)
        g.capture_end()
    g.replay()  # replaying on the default stream is allowed
    assert x.tolist() == [2.0, 2.0, 2.0]
