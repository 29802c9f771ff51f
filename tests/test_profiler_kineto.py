"""torch.profiler with CUDA activity on a modeled GPU: torch's own table and trace, holding the
modeled clock's kernels, read as users and Holistic Trace Analysis read them."""

from __future__ import annotations

import json
import math
import os
import time
import warnings

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import devlab
from devlab.engine.gpu_model.links import host_copy
from devlab.engine.gpu_model.modeled_clock import KERNEL, WAIT_HOST
from devlab.engine.gpu_model.specs import SPECS
from devlab.engine.simulated.base import session as sim_session
from devlab.engine.simulated.instruments import kineto_trace
from devlab.engine.simulated.instruments.profiler_kineto import DEFAULT_STREAM, MODELED, NCCL_STREAM

pytestmark = pytest.mark.usefixtures("no_simulation")

BOTH = [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def _kernels(prof) -> list:
    return [e for e in prof.events() if e.device_type == DeviceType.CUDA]


def _modeled_seconds(fn) -> list[float]:
    """The durations the modeled clock gives the kernels `fn` runs (its own timeline)."""
    return [s.end - s.start for s in devlab.simulated.timeline(fn).spans if s.kind == "kernel"]


def test_a_functional_asked_to_work_in_place_runs_its_kernel() -> None:
    # nn.ReLU(inplace=True) calls F.relu(x, inplace=True): its name does not say it writes in
    # place, and it makes no memory, yet it runs the kernel its out-of-place twin runs
    # (docs/profiler-validation.md: resnet18's ReLUs had no CUDA time).
    devlab.simulated.start(1, model="T4")
    x = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    for module in (torch.nn.ReLU, torch.nn.Hardtanh):  # `inplace` by keyword; by position
        (apart,) = _modeled_seconds(lambda m=module: m()(x))
        (in_place,) = _modeled_seconds(lambda m=module: m(inplace=True)(x))
        assert in_place == pytest.approx(apart) and in_place > 0, module


def test_cuda_activity_gives_modeled_kernels_in_torchs_table(capfd) -> None:
    devlab.simulated.start(1, model="T4")
    x = torch.randn(100, 100, device="cuda")
    torch.cuda.synchronize()
    (one,) = _modeled_seconds(lambda: x @ x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with profile(activities=BOTH) as prof:
            with record_function("loop"):
                for _ in range(3):
                    y = x @ x
            y.sum().item()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=20)
    assert not [w for w in caught if "CUDA" in str(w.message)]
    assert "Failed to record CUDA event" not in capfd.readouterr().err
    assert "Self CUDA" in table and "CUDA total" in table
    rows = {r.key: r for r in prof.key_averages()}
    # The products' kernels are aten::mm's, as on a GPU, each as long as the clock has it.
    assert rows["aten::mm"].count == 3
    ns = 3e-3  # the trace's resolution, a nanosecond per kernel
    assert rows["aten::mm"].self_device_time_total == pytest.approx(3 * one * 1e6, abs=ns)
    assert rows["aten::matmul"].self_device_time_total == 0
    assert rows["aten::matmul"].device_time_total == pytest.approx(3 * one * 1e6, abs=ns)
    loop = next(e for e in prof.events() if e.name == "loop")
    assert loop.device_time_total == pytest.approx(3 * one * 1e6, abs=ns)
    names = [k.name for k in _kernels(prof)]
    assert names.count(names[0]) == 3 and names[0].startswith(MODELED + "aten::mm")
    assert any(n.startswith(MODELED + "aten::sum") for n in names)
    # .item(): a 4-byte copy to pageable memory, as long as the copy engine's fixed time
    # (See Note [A small copy's fixed time on the GPU]), not a nanosecond of bandwidth.
    (item,) = [k for k in _kernels(prof) if k.name.startswith("Memcpy DtoH")]
    assert item.time_range.elapsed_us() == pytest.approx(
        host_copy(SPECS["T4"], 4, pinned=False).seconds * 1e6, abs=ns)
    # Every kernel row is on a CPU op's list too, once.
    assert sum(len(e.kernels) for e in prof.events()) == len(names)


def test_a_timeline_inside_a_profile_and_nothing_watched_after() -> None:
    devlab.simulated.start(1, model="T4")
    x = torch.randn(100, 100, device="cuda")
    clock = sim_session.session.charges.clock
    with profile(activities=BOTH) as prof:
        tl = devlab.simulated.timeline(lambda: x @ x)
        x @ x
    # The timeline sees its own work only: one kernel (and the GPU's wait for its launch)
    assert [s.kind for s in tl.spans if s.kind != WAIT_HOST] == [KERNEL]
    assert [k.name for k in _kernels(prof)].count(_kernels(prof)[0].name) == 2  # the profile both
    # Once the profile is over the clock keeps no record: an op costs what it did before.
    assert clock.spans is None and clock.recording is None


def _events_around_products(a: torch.Tensor, late_s: float = 0.0) -> tuple[float, float, float]:
    """Four products under a profile, CUDA events around the last three (`late_s`: the host
    sleeps that long before the first event): (the events' microseconds, the profile's three
    kernels' microseconds, the host's modeled microseconds from before the first event's record
    to after the second's)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=BOTH) as prof:
        a @ a  # queued first: the host launches the next ones while it runs
        time.sleep(late_s)
        host_before = devlab.simulated.modeled_time()
        start.record()
        for _ in range(3):
            a @ a
        end.record()
        host_after = devlab.simulated.modeled_time()
        end.synchronize()
    kernels = [k for k in _kernels(prof) if "aten::mm" in k.name]
    assert len(kernels) == 4
    return (start.elapsed_time(end) * 1e3, sum(k.time_range.elapsed_us() for k in kernels[1:]),
            (host_after - host_before) * 1e6)


def test_cuda_events_measure_what_the_profile_shows() -> None:
    # An event is stamped when its stream reaches it, or when the host records it if the
    # stream is already idle; a kernel starts at the later of its launch and its stream's end.
    # So the events measure the kernels between them plus the time the GPU waited for the
    # host, which only the host's time between the two records can hold, as on a GPU.
    devlab.simulated.start(1, model="T4")
    a = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    ns = 3e-3  # the trace's resolution, a nanosecond per kernel
    # With the host's time held to the modeled launches (a few microseconds each, against a
    # product's ~670 us), the queue never runs dry: the events measure the kernels exactly.
    with devlab.simulated.modeled_host():
        measured, kernels, _ = _events_around_products(a)
    assert measured == pytest.approx(kernels, abs=ns)
    # On the wall clock the host may come late: this machine's own hiccups (the CPU's first
    # munmap of a dropped product's 4 MiB, See Note [Why a storage's CPU memory is freed on the
    # host's clock], took 0.4 to 9 ms here under load), or, deliberately, a sleep longer than a
    # product. The GPU then idles until the next launch, and the events show it: more than the
    # kernels, never more than the kernels and the host's time between the records.
    for late_s in (0.0, 2e-3):
        measured, kernels, host = _events_around_products(a, late_s)
        assert kernels - ns <= measured <= kernels + host + ns, late_s
        if late_s:
            assert measured > kernels + ns  # the GPU waited for the sleeping host


def test_backward_kernels_belong_to_the_autograd_nodes() -> None:
    devlab.simulated.start(1, model="T4")
    x = torch.randn(64, 64, device="cuda")
    w = torch.randn(64, 64, device="cuda", requires_grad=True)
    with profile(activities=BOTH) as prof:
        (x @ w).relu().sum().backward()
    by_node = {e.name.rsplit(": ", 1)[-1]: e.device_time_total for e in prof.events()
               if e.name.startswith("autograd::engine::evaluate_function: ")}
    assert by_node["MmBackward0"] > 0 and by_node["ReluBackward0"] > 0
    assert not [e for e in prof.events() if e.name == "PythonDispatchMode"]


def test_profile_memory_shows_the_allocators_bytes() -> None:
    devlab.simulated.start(1, model="T4")
    before = torch.cuda.memory_allocated()
    with profile(activities=BOTH, profile_memory=True) as prof:
        t = torch.ones(1000, device="cuda")
    grew = torch.cuda.memory_allocated() - before
    ones = next(r for r in prof.key_averages() if r.key == "aten::ones")
    assert grew > 0 and ones.device_memory_usage == grew  # 4000 bytes as a 4096-byte block
    assert "CUDA Mem" in prof.key_averages().table()
    del t


def test_the_trace_is_kinetos(tmp_path) -> None:
    devlab.simulated.start(1, model="T4")
    x = torch.randn(100, 100, device="cuda")
    torch.cuda.synchronize()
    with profile(activities=BOTH) as prof:
        with record_function("products"):
            for _ in range(2):
                y = x @ x
        y.cpu()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left beside it
    events = trace["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op"}
    assert len(kernels) == 2 and all(k["name"].startswith(MODELED) for k in kernels)
    flows = {(e["ph"], e["id"]) for e in events if e.get("cat") == "ac2g"}
    for k in kernels:
        assert (k["pid"], k["tid"]) == (0, DEFAULT_STREAM)
        assert k["args"]["device"] == 0 and k["args"]["stream"] == DEFAULT_STREAM
        launch = runtime[k["args"]["correlation"]]
        assert launch["name"] == "cudaLaunchKernel" and launch["ts"] < k["ts"]
        op = ops[k["args"]["External id"]]  # the launch is inside the op that made it
        assert op["name"] == "aten::mm" and op["tid"] == launch["tid"]
        end = launch["ts"] + launch["dur"]
        assert op["ts"] <= launch["ts"] <= end <= op["ts"] + op["dur"] + 1e-3
        assert {("s", k["args"]["correlation"]), ("f", k["args"]["correlation"])} <= flows
    (a, b) = kernels
    assert b["ts"] >= a["ts"] + a["dur"]  # one stream runs one kernel at a time
    (ann,) = [e for e in events if e.get("cat") == "gpu_user_annotation"]
    assert (ann["name"], ann["pid"], ann["tid"]) == ("products", 0, DEFAULT_STREAM)
    assert (ann["ts"], ann["ts"] + ann["dur"]) == pytest.approx((a["ts"], b["ts"] + b["dur"]))
    (copy,) = [e for e in events if e.get("cat") == "gpu_memcpy"]
    assert copy["name"].startswith("Memcpy DtoH") and copy["args"]["bytes"] == 40000
    assert runtime[copy["args"]["correlation"]]["name"] == "cudaMemcpyAsync"
    (props,) = trace["deviceProperties"]
    assert props["id"] == 0 and "T4" in props["name"]
    assert (props["computeMajor"], props["computeMinor"], props["numSms"]) == (7, 5, 40)
    assert trace["distributedInfo"] == {"backend": "nccl", "rank": 0, "world_size": 1}


def test_schedule_tensorboard_handler_and_hta(tmp_path) -> None:
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis
    from torch.profiler import tensorboard_trace_handler

    devlab.simulated.start(1, model="T4")
    x = torch.randn(100, 100, device="cuda")
    ready = []
    handler = tensorboard_trace_handler(str(tmp_path / "tb"), worker_name="rank0")
    with profile(activities=BOTH, schedule=schedule(wait=1, warmup=1, active=2),
                 on_trace_ready=lambda p: (ready.append(p.key_averages()), handler(p))) as prof:
        for _ in range(4):
            for _ in range(5):
                x @ x
            prof.step()
    assert len(ready) == 1
    (trace_file,) = (tmp_path / "tb").iterdir()
    kernels = [e for e in json.loads(trace_file.read_text())["traceEvents"]
               if e.get("cat") == "kernel"]
    assert len(kernels) == 10  # the two active steps' products, none from wait or warm-up
    hta = TraceAnalysis(trace_dir=str(tmp_path / "tb"), include_last_profiler_step=True)
    breakdown = hta.get_gpu_kernel_breakdown(visualize=False)[1]
    # HTA reads times in whole microseconds: from the start rounded up to the end rounded down.
    assert breakdown["sum (us)"].sum() == sum(math.floor(k["ts"] + k["dur"]) - math.ceil(k["ts"])
                                              for k in kernels)
    temporal = hta.get_temporal_breakdown(visualize=False)
    assert temporal["compute_time(us)"].iloc[0] == breakdown["sum (us)"].sum()
    assert temporal["idle_time_pctg"].iloc[0] > 50  # 100x100 products: launch-bound
    # HTA's idle time analysis splits that idle time by its cause, all of it on stream 7.
    idle = hta.get_idle_time_breakdown(visualize=False)[0]
    assert set(idle["stream"]) == {DEFAULT_STREAM}
    assert idle["idle_time"].sum() == temporal["idle_time(us)"].iloc[0]


def _rank_trace(out_dir: str) -> str:
    """One rank of a two-GPU run: profile an all-reduce, write its own trace."""
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    t = torch.ones(1 << 20, device=rank)
    with profile(activities=BOTH) as prof:
        t = t * 2
        dist.all_reduce(t)
        torch.cuda.synchronize()
    path = os.path.join(out_dir, f"rank{rank}.json")
    prof.export_chrome_trace(path)
    dist.destroy_process_group()
    return path


def test_each_rank_writes_its_own_trace_with_its_nccl_kernels(tmp_path) -> None:
    devlab.simulated.start(2, model="T4")
    paths = devlab.launch(_rank_trace, str(tmp_path), nprocs=2, timeout=300)
    for rank, path in enumerate(paths):
        trace = json.loads(open(path).read())
        info = trace["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, 2, "nccl")
        kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
        assert {k["pid"] for k in kernels} == {rank}  # its own GPU's track only
        (nccl,) = [k for k in kernels if "nccl:all_reduce" in k["name"]]
        assert nccl["tid"] == NCCL_STREAM and nccl["args"]["stream"] == NCCL_STREAM
        # NCCL's kernel name first, as HTA finds communication (`^nccl.*Kernel`), then the model's.
        assert nccl["name"].startswith("ncclDevKernel_AllReduce_RING_")
        assert f"({MODELED}nccl:all_reduce (" in nccl["name"]
        (mul,) = [k for k in kernels if k["tid"] == DEFAULT_STREAM]
        assert nccl["ts"] >= mul["ts"] + mul["dur"]  # NCCL's stream waited for the product
    if_hta = pytest.importorskip("hta.trace_analysis")
    (tmp_path / "hta").mkdir()
    for path in paths:
        os.replace(path, tmp_path / "hta" / os.path.basename(path))
    hta = if_hta.TraceAnalysis(trace_dir=str(tmp_path / "hta"), include_last_profiler_step=True)
    assert sorted(hta.t.get_ranks()) == [0, 1]
    # HTA counts the all-reduce as communication, not computation.
    kinds = hta.get_gpu_kernel_breakdown(visualize=False)[0]
    assert "COMMUNICATION" in set(kinds["kernel_type"])


def test_cuda_activity_alone_gives_the_gpus_side_only(tmp_path) -> None:
    devlab.simulated.start(1, model="T4")
    x = torch.randn(100, 100, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        x @ x
    assert {e.device_type for e in prof.events()} == {DeviceType.CUDA}
    assert "Self CUDA" in prof.key_averages().table()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    cats = {e.get("cat") for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]
            if e.get("ph") == "X"}
    assert cats == {"cuda_runtime", "kernel"}


def test_without_a_model_no_warnings_and_no_device_columns(capfd) -> None:
    devlab.simulated.start(1)
    x = torch.randn(10, 10, device="cuda")
    with profile(activities=BOTH) as prof:
        x @ x
    assert "Self CUDA" not in prof.key_averages().table()
    assert "Failed to record CUDA event" not in capfd.readouterr().err


def test_stop_restores_torchs_profiler() -> None:
    cls = torch.autograd.profiler.profile
    names = ("__init__", "_start_trace", "__exit__", "_parse_kineto_results",
             "export_chrome_trace")
    before = {n: vars(cls)[n] for n in names}
    devlab.simulated.start(1, model="T4")
    assert any(vars(cls)[n] is not before[n] for n in names)
    x = torch.randn(10, 10, device="cuda")
    prof = profile(activities=BOTH)
    prof.__enter__()
    clock = sim_session.session.charges.clock
    x @ x
    assert clock.spans is not None
    devlab.simulated.stop()  # while it records: the clock is no longer watched
    assert clock.spans is None and clock.recording is None
    assert {n: vars(cls)[n] for n in names} == before
    torch.autograd._disable_profiler()  # torch's own __exit__ would need a GPU now


def test_merge_is_a_pure_function_of_the_trace_and_activities() -> None:
    cpu = {"baseTimeNanoseconds": 1_000_000, "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 5, "tid": 9, "ts": 1.0,
         "dur": 10.0, "args": {"External id": 3}},
        {"ph": "X", "cat": "cpu_op", "name": "PythonDispatchMode", "pid": 5, "tid": 9,
         "ts": 2.0, "dur": 1.0, "args": {}}]}
    act = kineto_trace.Activity(kineto_trace.KERNEL, "modeled: k", 1, 7, 1_020_000, 5_000,
                                77, 9, 1_008_000, 2_000, 3)
    out = kineto_trace.merge(cpu, [act], 5, [{"id": 1}], {"rank": 1, "world_size": 2,
                                                          "backend": "nccl"},
                             hidden=frozenset({"PythonDispatchMode"}))
    assert len(cpu["traceEvents"]) == 2 and "deviceProperties" not in cpu  # input untouched
    by_cat = {}
    for e in out["traceEvents"]:
        by_cat.setdefault(e.get("cat"), []).append(e)
    (kernel,) = by_cat["kernel"]
    assert (kernel["pid"], kernel["tid"], kernel["ts"], kernel["dur"]) == (1, 7, 20.0, 5.0)
    (launch,) = by_cat["cuda_runtime"]
    assert (launch["pid"], launch["tid"], launch["ts"], launch["dur"]) == (5, 9, 8.0, 2.0)
    assert launch["args"]["correlation"] == kernel["args"]["correlation"] == 77
    assert [e["ph"] for e in by_cat["ac2g"]] == ["s", "f"]
    assert [e["name"] for e in by_cat["cpu_op"]] == ["aten::mm"]
    assert out["distributedInfo"]["rank"] == 1 and out["deviceProperties"] == [{"id": 1}]


def test_a_layers_backward_kernels_go_to_its_own_backward_op() -> None:
    # A batch norm's and a max pool's backward kernels are theirs on the table (the nodes
    # are CudnnBatchNormBackward0, as on a GPU, and MaxPool2DWithIndicesBackward0, their
    # calls aten::batch_norm and aten::max_pool2d), not the next node's.
    devlab.simulated.start(1, model="T4")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
                                torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3),
                                torch.nn.BatchNorm2d(8)).cuda()
    x = torch.randn(4, 3, 32, 32, device="cuda")
    model(x).sum().backward()
    backward = [s.name for s in devlab.simulated.timeline(
        lambda: model(x).sum().backward()).spans if s.kind == KERNEL]
    with profile(activities=BOTH) as prof:
        model(x).sum().backward()
        torch.cuda.synchronize()
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["aten::cudnn_batch_norm_backward"].count == 2
    norms = [k for e in prof.events() if e.name == "aten::cudnn_batch_norm_backward"
             for k in e.kernels]
    assert len(norms) == backward.count("aten::batch_norm (backward)") > 0
    pools = [k for e in prof.events() if e.name == "aten::max_pool2d_with_indices_backward"
             for k in e.kernels]
    assert len(pools) == backward.count("aten::max_pool2d (backward)") > 0


def test_a_convolution_is_named_as_a_gpus_torch_runs_it(tmp_path) -> None:
    # Below aten::_convolution a GPU runs cuDNN's (aten::cudnn_convolution), or CUDA's own
    # depthwise kernel for a float32 depthwise convolution; the CPU's name stays for a
    # convolution on the host, and where the arguments do not settle it (cuDNN off).
    devlab.simulated.start(1, model="T4")
    x = torch.randn(2, 8, 16, 16, device="cuda")
    dense = torch.nn.Conv2d(8, 8, 3).cuda()
    depthwise = torch.nn.Conv2d(8, 8, 3, groups=8).cuda()
    host = torch.nn.Conv2d(8, 8, 3)
    with profile(activities=BOTH) as prof:
        dense(x).sum().backward()
        dense(x)
        depthwise(x)
        host(x.cpu())
        torch.cuda.synchronize()
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["aten::cudnn_convolution"].count == 2
    assert rows["aten::cudnn_convolution"].self_device_time_total > 0
    assert rows["aten::_conv_depthwise2d"].count == 1
    assert rows["aten::mkldnn_convolution"].count == 1  # the host's
    assert rows["aten::mkldnn_convolution"].self_device_time_total == 0
    kernels = [k.name for k in _kernels(prof)]
    assert sum(n.startswith(MODELED + "aten::cudnn_convolution (") for n in kernels) == 2
    assert not any("mkldnn" in n for n in kernels)
    ops = _traced_cpu_ops(prof, tmp_path)
    assert ops.count("aten::cudnn_convolution") == 2 and ops.count("aten::_conv_depthwise2d") == 1
    assert ops.count("aten::mkldnn_convolution") == 1
    torch.backends.cudnn.enabled = False
    try:
        with profile(activities=BOTH) as off:
            dense(x)
            torch.cuda.synchronize()
    finally:
        torch.backends.cudnn.enabled = True
    names = {r.key for r in off.key_averages()}
    assert "aten::mkldnn_convolution" in names and "aten::cudnn_convolution" not in names


def _traced_cpu_ops(prof, folder) -> list[str]:
    """The CPU ops' names in the Chrome trace `prof` exports, in order."""
    path = folder / "trace.json"
    prof.export_chrome_trace(str(path))
    return [e["name"] for e in json.loads(path.read_text())["traceEvents"]
            if e.get("cat") == "cpu_op"]


def _names(prof) -> set[str]:
    return {r.key for r in prof.key_averages()}


def test_a_batch_norm_is_named_as_a_gpus_torch_runs_it(tmp_path) -> None:
    # With cuDNN on, a GPU's torch runs aten::cudnn_batch_norm, its node is
    # CudnnBatchNormBackward0, and in training the node runs aten::cudnn_batch_norm_backward
    # (in evaluation, aten::native_batch_norm_backward): every one of a network's batch norms,
    # though some of their backward kernels are not matched to their own node.
    devlab.simulated.start(1, model="T4")
    blocks = [m for _ in range(6) for m in (torch.nn.Conv2d(4, 4, 3, padding=1, bias=False),
                                            torch.nn.BatchNorm2d(4), torch.nn.ReLU(inplace=True))]
    net = torch.nn.Sequential(*blocks).cuda()
    x = torch.randn(2, 4, 8, 8, device="cuda")
    net(x).sum().backward()
    with profile(activities=BOTH) as prof:
        net(x).sum().backward()
        torch.cuda.synchronize()
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["aten::cudnn_batch_norm"].count == 6
    assert rows["aten::cudnn_batch_norm"].self_device_time_total > 0
    assert rows["aten::cudnn_batch_norm_backward"].count == 6
    assert rows["CudnnBatchNormBackward0"].count == 6
    assert rows["autograd::engine::evaluate_function: CudnnBatchNormBackward0"].count == 6
    assert not {"aten::native_batch_norm", "aten::native_batch_norm_backward",
                "NativeBatchNormBackward0"} & set(rows)
    kernels = [k.name for k in _kernels(prof)]
    assert sum(n.startswith(MODELED + "aten::cudnn_batch_norm (") for n in kernels) == 6
    assert not any("native_batch_norm" in n for n in kernels)
    ops = _traced_cpu_ops(prof, tmp_path)
    assert ops.count("aten::cudnn_batch_norm") == 6 and "NativeBatchNormBackward0" not in ops
    assert ops.count("CudnnBatchNormBackward0") == 6
    # Evaluation: cuDNN's forward, CUDA's own backward below cuDNN's node.
    net.eval()
    with profile(activities=BOTH) as evaluated:
        net(x).sum().backward()
        torch.cuda.synchronize()
    names = _names(evaluated)
    assert {"aten::cudnn_batch_norm", "CudnnBatchNormBackward0",
            "aten::native_batch_norm_backward"} <= names
    assert not {"aten::cudnn_batch_norm_backward", "NativeBatchNormBackward0"} & names


@pytest.mark.parametrize("case", ["cudnn off", "2-D input", "no affine", "on the host"])
def test_a_batch_norm_keeps_the_cpus_name_where_a_gpu_runs_cudas_own(case: str) -> None:
    # _select_batch_norm_backend runs CUDA's own kernels (aten::native_batch_norm, the CPU's
    # name too) with cuDNN off, for fewer than 3 dimensions, without weight and bias.
    devlab.simulated.start(1, model="T4")
    bn = torch.nn.BatchNorm1d(4, affine=case != "no affine")
    x = torch.randn(8, 4, 5) if case != "2-D input" else torch.randn(8, 4)
    if case != "on the host":
        bn, x = bn.cuda(), x.cuda()
    x.requires_grad_()
    torch.backends.cudnn.enabled = case != "cudnn off"
    try:
        with profile(activities=BOTH) as prof:
            bn(x).sum().backward()
            torch.cuda.synchronize()
    finally:
        torch.backends.cudnn.enabled = True
    names = _names(prof)
    assert {"aten::native_batch_norm", "aten::native_batch_norm_backward",
            "NativeBatchNormBackward0"} <= names, names
    assert not any("cudnn" in n.lower() for n in names), names


def test_a_kernel_starts_as_soon_after_its_launch_as_the_model_queues_it(tmp_path) -> None:
    # A backward pass's kernels are charged together at its end, but each one's launch is drawn
    # inside its autograd node, where the CPU ran it: the kernel must follow that launch by the
    # modeled queue's wait, not by the CPU's time to compute the rest of the backward (HTA read
    # 40-130 ms launch delays and 8 kernels queued on an idle GPU). No kernel can wait longer
    # than all the modeled work and launches queued ahead of it; the bound is twice that and a
    # millisecond (a few ms), where the CPU's backward here takes tens to hundreds of ms.
    devlab.simulated.start(1, model="T4")
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).cuda()
    x = torch.randn(256, 1024, device="cuda")
    model(x).sum().backward()
    torch.cuda.synchronize()
    with profile(activities=BOTH) as prof:
        model(x).pow(2).mean().backward()
        torch.cuda.synchronize()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert any("backward" in k["name"] for k in kernels)
    bound = 2 * sum(k["dur"] + runtime[k["args"]["correlation"]]["dur"] for k in kernels) + 1000
    for k in kernels:
        launch = runtime[k["args"]["correlation"]]
        delay = k["ts"] - (launch["ts"] + launch["dur"])
        assert 0 <= delay <= bound, (k["name"], delay, bound)
