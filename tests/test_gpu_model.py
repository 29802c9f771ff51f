"""Simulated GPUs with a performance model of a named real GPU: the model itself
(devlab.gpu_model: tiles in waves, achieved rates, bandwidth curve, floors, two ways of timing),
the modeled clock that charges it, and everywhere it shows (events, timing, exercises, labels);
the model against measured kernels and whole models (benchmarks/gpu_model.py)."""

from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import replace

import pytest
import torch
from torch import nn

import devlab
from devlab.core import timing
from devlab.engine import gpu_model, simulated
from devlab.engine.gpu_model import CALIBRATION, SPECS
from devlab.engine.gpu_model.kernels import COMPUTE, ELEMENTWISE, GEMM, LAYER_NORM, SOFTMAX, l2_miss
from devlab.engine.simulated.clock import roofline as _roofline
from devlab.fronts.lab import exercises

pytestmark = pytest.mark.usefixtures("no_simulation")

T4 = SPECS["T4"]
LAUNCH = T4.launch_latency_us * 1e-6
SYNC = T4.sync_latency_us * 1e-6


@pytest.fixture
def t4(modeled_host):
    devlab.config.simulate_gpus(2, model="T4")
    yield simulated
    devlab.config.stop_simulation()


def _product(n: int, gpu: str = "T4", dtype: str = "float32") -> gpu_model.Kernel:
    """The model's kernel of an n x n by n x n product."""
    return gpu_model.predict("mm", ((n, n), (n, n)), dtype, gpu)


# --- the model of one kernel (pure: no simulation, no op run) ----------------------------------

def test_a_pageable_copy_is_staged_at_the_measured_fraction_of_the_pinned_rate() -> None:
    # bandwidthTest on a DGX A100 (links.py): 10.0 GB/s pageable against 25.7 pinned.
    assert gpu_model.host_copy_gbs(T4, pinned=True) == T4.host_link_gbs
    a100 = SPECS["A100-80GB"]
    ratio = gpu_model.host_copy_gbs(a100, pinned=False) / gpu_model.host_copy_gbs(a100, True)
    assert ratio == pytest.approx(10.0 / 25.7, abs=0.02)
    assert gpu_model.host_copy_gbs(T4, pinned=False) < T4.host_link_gbs / 2


def test_a_small_host_copy_takes_the_fixed_time_published_traces_show() -> None:
    # See Note [A small copy's fixed time on the GPU] (links.py): the GPU-side durations of
    # copies of 1 B to 1 KiB in published torch.profiler and nvprof traces.
    bench, _ = _benchmark()
    copies = bench.SMALL_COPIES
    assert {(c.direction, c.pinned) for c in copies} == {
        ("device → host", False), ("host → device", False), ("host → device", True)}
    for c in copies:
        ratio = c.model_us() / c.us
        assert 0.5 <= ratio <= 2.0, (c, ratio)  # every row within 2x
        if c.copies >= 30:  # the means of 30 copies or more within 1.5x
            assert 1 / 1.5 <= ratio <= 1.5, (c, ratio)
    # The host's side of a synchronous small copy (launch, copy, wait, wake-up: `.item()`, and
    # a 4-byte copy with cudaStreamSynchronize in C++) within 2x of the published runs.
    syncs = [r for r in bench.rows() if "[pytorch#119202]" in r.what or "[imp#1654]" in r.what]
    assert len(syncs) == 2 and all(0.5 <= r.ratio <= 2.0 for r in syncs), syncs
    # Bandwidth alone would give 4 bytes about a nanosecond: the fixed time is the copy.
    item = gpu_model.host_copy(T4, 4, pinned=False)
    assert item.link < 1e-9 and item.fixed == gpu_model.HOST_COPY_LATENCY_US * 1e-6
    # A large copy is its bytes: 32 MB pinned (bandwidthTest's size) changes by under 0.1 %.
    large = gpu_model.host_copy(T4, 32_000_000, pinned=True)
    assert large.link == 32_000_000 / (T4.host_link_gbs * 1e9) and large.fixed / large.link < 1e-3
    assert gpu_model.host_copy(T4, 0, pinned=True).seconds == 0.0  # torch copies nothing
    with pytest.raises(ValueError, match="expected 0 or more bytes"):
        gpu_model.host_copy(T4, -1, pinned=True)


def test_a_product_runs_in_whole_waves_of_tiles_at_the_achieved_rate() -> None:
    tm, tn, per_sm = CALIBRATION["T4"].mm.tile
    rows = tm * T4.sms * per_sm  # one column of tiles: exactly one full wave
    full = gpu_model.predict("mm", ((rows, 4096), (4096, tn)), "float32", "T4")
    over = gpu_model.predict("mm", ((rows + 1, 4096), (4096, tn)), "float32", "T4")
    assert (full.waves, full.last_wave) == (1, 1.0)
    assert over.waves == 2 and over.last_wave == pytest.approx(1 / (T4.sms * per_sm))
    assert over.compute == pytest.approx(2 * full.compute)  # one more tile costs a whole wave
    achieved = CALIBRATION["T4"].mm.fp32 * T4.fp32_tflops
    assert full.achieved_tflops == pytest.approx(achieved) and achieved < T4.fp32_tflops
    big = _product(8192)
    # A full GPU runs at the achieved rate, less each tile's prologue and epilogue.
    assert big.flops / big.compute / 1e12 == pytest.approx(achieved, rel=0.01)
    assert big.bound == COMPUTE and big.seconds == pytest.approx(big.floor + big.compute)


def test_tensor_core_products_run_at_the_published_rates() -> None:
    for gpu, dtype, published in (("T4", "float16", 41.91), ("H100", "bfloat16", 797.51),
                                  ("A100-80GB", "tf32", 116.0), ("T4", "bfloat16", 2.46)):
        k = _product(8192, gpu, dtype)
        assert k.achieved_tflops == pytest.approx(published), (gpu, dtype)
        # Less a partly full last wave and the tiles' prologues.
        assert 0.95 * published < k.flops / k.compute / 1e12 <= published, (gpu, dtype)


def test_a_small_product_is_spread_over_more_sms_in_smaller_tiles() -> None:
    small = _product(100)
    tm, tn, _ = CALIBRATION["T4"].mm.tile
    one_tile = tm * tn * 2 * (100 + gpu_model.calibration.PROLOGUE_K) / (
        small.achieved_tflops * 1e12 / T4.sms)
    assert small.tiles > 2 and small.compute < one_tile / 2


def test_a_batched_fit_with_one_whole_kernel_pays_for_the_tile_on_narrow_products() -> None:
    # The A100's batched products run cuBLAS's 128 x 128 kernel for every shape: 64 output
    # columns take as long as 128, and a product under a wave is not spread in smaller tiles.
    fit = CALIBRATION["A100-PCIe-40GB"].bmm
    assert fit.whole and fit.tile == (128, 128, 1) and fit.cut is not None

    def bmm(batch: int, m: int, n: int, k: int = 512) -> gpu_model.Kernel:
        return gpu_model.predict("bmm", ((batch, m, k), (batch, k, n)), "float32",
                                 "A100-PCIe-40GB")

    assert bmm(864, 512, 64).compute == pytest.approx(bmm(864, 512, 128).compute)
    small = bmm(1, 128, 128)
    assert (small.tiles, small.waves) == (1, 1)
    # The same shapes with the tiles cut to them: the narrow one costs half.
    cut = replace(CALIBRATION["A100-PCIe-40GB"], bmm=replace(fit, whole=False))
    spec = SPECS["A100-PCIe-40GB"]
    narrow = gpu_model.gemm(spec, 864, 512, 64, 512, "float32", 4, True, cal=cut)
    wide = gpu_model.gemm(spec, 864, 512, 128, 512, "float32", 4, True, cal=cut)
    assert narrow.compute == pytest.approx(wide.compute / 2, rel=0.05)
    assert gpu_model.gemm(spec, 1, 128, 128, 512, "float32", 4, True, cal=cut).tiles > 1


def test_a_board_without_rows_takes_batched_tiles_from_its_architecture() -> None:
    from devlab.engine.gpu_model.calibration import tile_source
    # Same major compute capability: the nearest such board, a whole kernel kept (the L4's
    # for an Ada or GA10x board, the V100's for the T4, the P100's for the P4).
    assert tile_source(SPECS["RTX-4090"]) == ("L4", True)
    assert tile_source(SPECS["A10G"]) == ("L4", True)
    assert tile_source(SPECS["T4"], ["V100", "A100-PCIe-40GB", "P100"]) == ("V100", True)
    assert tile_source(SPECS["P4"], ["P100", "T4"]) == ("P100", True)
    assert CALIBRATION["RTX-4090"].bmm.whole and CALIBRATION["RTX-4090"].bmm.tile == (128, 128, 1)
    # No measured board of its architecture: the nearest's tiles, cut to the shape.
    assert tile_source(SPECS["B200"]) == ("H100", False)
    assert tile_source(SPECS["H100"], ["A100-PCIe-80GB", "L4", "T4"]) == ("L4", False)
    assert not CALIBRATION["RTX-5090"].bmm.whole


def test_a_shape_cut_batched_tile_is_the_one_the_measured_shape_cut_fits_share() -> None:
    from devlab.engine.gpu_model.calibration import MEASURED, from_datasheet, shape_cut_tile
    fitted = {g: CALIBRATION[g] for g in MEASURED}
    cut = [CALIBRATION[g].bmm.tile for g in MEASURED if not CALIBRATION[g].bmm.whole]
    assert sorted(cut) == [(64, 64, 4), (64, 64, 4), (128, 32, 4)]  # T4, H100; V100
    assert shape_cut_tile(fitted) == (64, 64, 4)
    # A tie goes to the squarer tile: the T4 left out (the V100's 128 x 32, the H100's 64 x 64).
    t4_out = {g: c for g, c in fitted.items() if g != "T4"}
    assert shape_cut_tile(t4_out) == (64, 64, 4)
    assert from_datasheet(SPECS["T4"], fitted=t4_out).bmm.tile == (64, 64, 4)
    wide = {g: replace(c, bmm=replace(c.bmm, tile=(128, 32, 4))) if g == "H100" else c
            for g, c in t4_out.items()}
    assert shape_cut_tile(wide) == (128, 32, 4)
    # A whole kernel of the board's architecture is kept (the L4's for an Ada board), and a
    # second board of a measured chip keeps that chip's shape-cut tile (the V100 SXM2).
    assert CALIBRATION["RTX-4090"].bmm.tile == CALIBRATION["L4"].bmm.tile
    assert CALIBRATION["V100-SXM2-16GB"].bmm.tile == CALIBRATION["V100"].bmm.tile == (128, 32, 4)
    assert CALIBRATION["B200"].bmm.tile == (64, 64, 4) and not CALIBRATION["B200"].bmm.whole


def test_batched_products_run_faster_where_memory_keeps_up_with_the_fp32_peak() -> None:
    from devlab.engine.gpu_model.calibration import DATASHEET_RULE as rule
    from devlab.engine.gpu_model.calibration import flops_per_byte
    lowest, median = rule.balance
    assert lowest < median and rule.balance_exponent > 0
    # At or above the median balance (the RTX 4090: 82 FLOPs per byte) the estimate x bmm alone.
    spec = SPECS["RTX-4090"]
    assert flops_per_byte(spec) > median
    assert rule.bmm_fraction(spec) == pytest.approx(rule.fp32_fraction(spec) * rule.bmm)
    # Below it (the H200: 67 TFLOPS on 4.8 TB/s), more by (median / its balance)^exponent.
    h200 = SPECS["H200"]
    boost = rule.bmm_fraction(h200) / (rule.fp32_fraction(h200) * rule.bmm)
    assert boost == pytest.approx((median / flops_per_byte(h200)) ** rule.balance_exponent)
    assert boost > 1.05
    # A balance below the lowest measured board's is read as that one's: no further trend.
    double = replace(h200, memory_bandwidth_gbs=h200.memory_bandwidth_gbs * 4)
    assert flops_per_byte(double) < lowest
    same = replace(double, memory_bandwidth_gbs=double.memory_bandwidth_gbs * 2)
    assert rule.bmm_fraction(double) == rule.bmm_fraction(same)
    assert rule.bmm_fraction(double) / rule.bmm_fraction(h200) > 1
    # What the boards without rows get, and products (mm) untouched by it.
    assert CALIBRATION["H200"].bmm.fp32 == round(rule.bmm_fraction(h200), 3)
    assert CALIBRATION["H200"].mm.fp32 == round(rule.fp32_fraction(h200) * rule.mm, 3)


def test_a_slot_powered_board_runs_short_batched_products_faster_than_sustained_ones() -> None:
    from devlab.engine.gpu_model.calibration import SUSTAIN_WINDOW, bursts, from_datasheet
    # The datasheet decides which boards: at most 75 W and a base clock under half the boost.
    assert sorted(g for g, s in SPECS.items() if bursts(s)) == ["L4", "T4"]
    fit = CALIBRATION["T4"].bmm
    assert fit.burst > 1 and CALIBRATION["T4"].mm.burst == 1.0
    cut = replace(CALIBRATION["T4"], bmm=replace(fit, burst=1.0))

    def ratio(batch: int) -> tuple[float, float]:
        """(modeled compute with the burst / without, the compute without) of a bmm."""
        plain = gpu_model.gemm(T4, batch, 512, 512, 512, "float32", 4, True, cal=cut).compute
        return gpu_model.gemm(T4, batch, 512, 512, 512, "float32", 4, True).compute / plain, plain

    (short, t_short), (long_, t_long) = ratio(8), ratio(4096)
    assert t_short < SUSTAIN_WINDOW[0] < SUSTAIN_WINDOW[1] < t_long
    assert short == pytest.approx(fit.burst ** -0.5) and long_ == pytest.approx(fit.burst ** 0.5)
    # In the window the factor moves between the two, and plain products never carry it.
    middle, t_mid = ratio(640)
    assert SUSTAIN_WINDOW[0] < t_mid < SUSTAIN_WINDOW[1] and short < middle < long_
    mm = gpu_model.gemm(T4, 1, 512, 512, 512, "float32", 4, False)
    assert mm.compute == gpu_model.gemm(T4, 1, 512, 512, 512, "float32", 4, False, cal=cut).compute
    # A board left out takes the other slot-powered boards' burst; the others take none.
    others = {g: CALIBRATION[g] for g in ("P4", "V100", "L4", "A100-PCIe-40GB")}
    assert from_datasheet(T4, fitted=others).bmm.burst == CALIBRATION["L4"].bmm.burst
    assert from_datasheet(SPECS["RTX-4060"]).bmm.burst == 1.0


def test_memory_bound_ops_follow_a_bandwidth_curve_below_the_achieved_peak() -> None:
    sizes = [2**10, 2**20, 2**24, 2**28]
    curve = [gpu_model.predict("add", ((n,), (n,)), "float32", "T4").bandwidth_gbs
             for n in sizes]
    big = gpu_model.predict("add", ((2**28,), (2**28,)), "float32", "T4")
    assert curve == sorted(curve) and curve[0] < 0.05 * curve[-1]  # the floor dominates tiny ops
    assert curve[-1] == pytest.approx(big.achieved_gbs, rel=0.01)
    assert big.achieved_gbs == pytest.approx(CALIBRATION["T4"].bandwidth * T4.memory_bandwidth_gbs)
    assert big.achieved_gbs < T4.memory_bandwidth_gbs and big.nbytes == 3 * 2**28 * 4
    soft = gpu_model.predict("softmax", ((4096, 4096),), "float32", "T4")
    norm = gpu_model.predict("aten::native_layer_norm", ((4096, 4096),), "float32", "T4")
    assert (soft.family, norm.family) == (SOFTMAX, LAYER_NORM)
    assert soft.memory == pytest.approx(2 * 4096**2 * 4 / (soft.achieved_gbs * 1e9))
    assert gpu_model.family("aten::some_new_op_") == ELEMENTWISE


def test_softmax_and_layer_norm_rows_that_outgrow_the_l2_reread_dram() -> None:
    def gbs(op: str, rows: int, cols: int, gpu: str) -> float:
        return gpu_model.predict(op, ((rows, cols),), "float32", gpu).achieved_gbs

    # The same bytes: rows of 12,288 outgrow the T4's 4 MB of L2 (softmax then moves 2x its
    # counted bytes, layer norm 1.5x), not the L4's 48 MB.
    t4, bw = CALIBRATION["T4"], T4.memory_bandwidth_gbs
    assert gbs("softmax", 2**16, 1536, "T4") == pytest.approx(t4.softmax * bw, rel=0.01)
    assert gbs("softmax", 2**13, 12288, "T4") == pytest.approx(t4.softmax * bw / 2, rel=0.01)
    assert gbs("layer_norm", 2**13, 12288, "T4") == pytest.approx(t4.layer_norm * bw / 1.5,
                                                                  rel=0.01)
    l4 = SPECS["L4"]
    assert gbs("softmax", 2**13, 12288, "L4") == pytest.approx(
        CALIBRATION["L4"].softmax * l4.memory_bandwidth_gbs, rel=0.01)
    # A row of at most 1,024 runs the warp kernel: the element-wise bandwidth, nearly.
    warp = gbs("softmax", 2**16, 1024, "T4")
    assert warp == pytest.approx(0.95 * t4.bandwidth * bw, rel=0.01)
    assert l2_miss(SPECS["T4"], SOFTMAX, 0) == 0.0
    # A row not known (the clock sees bytes only) is taken as 1,024 elements.
    unknown = gpu_model.memory_bound(T4, LAYER_NORM, 2**26)
    assert unknown.achieved_gbs == pytest.approx(gbs("layer_norm", 2**13, 1024, "T4"))
    assert gpu_model.memory_bound(T4, SOFTMAX, 2**26).achieved_gbs == pytest.approx(warp)


def test_two_ways_of_timing_one_op() -> None:
    for gpu in ("T4", "A100-PCIe-40GB", "H100"):
        k = gpu_model.predict("relu", ((1024,),), "float32", gpu)
        # Queued: the GPU's floor plus the work; timed alone with CUDA events: the host's work
        # before the launch is on the clock too, a floor of tens of microseconds.
        assert k.seconds == pytest.approx(k.floor + k.work) and k.floor < 2e-6
        assert k.alone == pytest.approx(CALIBRATION[gpu].alone_floor_us * 1e-6 + k.work)
        assert 10e-6 < k.alone < 26e-6


def test_a_products_backward_is_two_products_and_a_convolution_is_one() -> None:
    grads = gpu_model.op_costs.backward("mm", ((512, 256), (256, 1024)), "float32", "T4")
    forward = gpu_model.predict("mm", ((512, 256), (256, 1024)), "float32", "T4")
    assert [g.family for g in grads] == [GEMM, GEMM]
    assert all(g.flops == forward.flops for g in grads)
    conv = gpu_model.predict("conv2d", ((8, 64, 32, 32), (128, 64, 3, 3)), "float32", "T4",
                             out=(8, 128, 32, 32))
    assert conv.family == GEMM and conv.flops == 2 * (8 * 32 * 32) * 128 * (64 * 9)
    up = gpu_model.predict("conv_transpose2d", ((8, 64, 16, 16), (64, 32, 4, 4)), "float32", "T4")
    assert up.family == GEMM and up.flops == 2 * (8 * 16 * 16) * 64 * (32 * 16)
    soft = gpu_model.op_costs.backward("softmax", ((64, 64),), "float32", "T4")
    assert soft[0].nbytes == 1.5 * gpu_model.predict("softmax", ((64, 64),), "float32",
                                                     "T4").nbytes


def test_tf32_follows_torchs_switch_on_gpus_that_have_it() -> None:
    a100 = SPECS["A100-80GB"]
    a = torch.empty(4096, 4096, device="meta")
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    try:
        matmul.allow_tf32 = True
        fast = _roofline.op_time(a100, 0, torch.ops.aten.mm.default, (a, a), {}, a).compute
        on_t4 = _roofline.op_time(T4, 0, torch.ops.aten.mm.default, (a, a), {}, a).compute
        matmul.allow_tf32 = False
        slow = _roofline.op_time(a100, 0, torch.ops.aten.mm.default, (a, a), {}, a).compute
    finally:
        matmul.allow_tf32 = before
    assert slow / fast > 4  # TF32 tensor cores
    assert on_t4 == pytest.approx(_product(4096).compute)  # a T4 has no TF32


def test_views_and_allocations_launch_no_kernel() -> None:
    x = torch.empty(4096, 4096, device="meta")
    t = _roofline.op_time(T4, 1, torch.ops.aten.add.Tensor, (x, x), {}, x)
    assert t.flops == 0 and t.bound == _roofline.MEMORY and t.device == 1
    assert t.gpu == pytest.approx(gpu_model.predict("add", ((4096, 4096),) * 2).seconds)
    tiny = torch.empty(4, device="meta")
    assert _roofline.op_time(T4, 0, torch.ops.aten.add.Tensor, (tiny, tiny), {}, tiny).bound \
        == _roofline.LAUNCH
    assert not _roofline.launches_kernel(torch.ops.aten.view.default)
    assert not _roofline.launches_kernel(torch.ops.aten.empty.memory_format)
    assert _roofline.launches_kernel(torch.ops.aten.mm.default)


# --- the clock: queues, overlap, syncs, copies, events -----------------------------------------

def test_events_give_modeled_milliseconds_of_queued_work(t4) -> None:
    x = torch.randn(1024, 1024, device="cuda:0")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(5):
        y = x @ x
    end.record()
    torch.cuda.synchronize()
    one = _product(1024).seconds
    # The queue was idle at the start: the first product waits for its launch only.
    assert start.elapsed_time(end) == pytest.approx((LAUNCH + 5 * one) * 1e3, rel=1e-6)
    assert torch.allclose(y.cpu(), x.cpu() @ x.cpu())  # values stay real


def test_ops_queue_and_a_host_sync_waits_for_the_queue(t4) -> None:
    x = torch.randn(1024, 1024, device="cuda:0")
    torch.cuda.synchronize()
    t0 = simulated.modeled_time()
    x @ x
    launched = simulated.modeled_time() - t0
    assert launched == pytest.approx(LAUNCH)  # the host only launched it
    (x @ x).sum().item()
    assert simulated.modeled_time() - t0 > 2 * _product(1024).seconds  # .item() waited for both


def test_two_gpus_have_two_queues(t4) -> None:
    a = [torch.randn(1024, 1024, device=f"cuda:{i}") for i in (0, 1)]
    torch.cuda.synchronize()
    t0 = simulated.modeled_time()
    a[0] @ a[0], a[0] @ a[0]
    torch.cuda.synchronize()
    one_gpu = simulated.modeled_time() - t0
    t0 = simulated.modeled_time()
    a[0] @ a[0], a[1] @ a[1]
    torch.cuda.synchronize()
    two_gpus = simulated.modeled_time() - t0
    assert one_gpu / two_gpus > 1.9


def test_copies_cross_the_host_link_and_copies_to_the_host_wait(t4) -> None:
    host = torch.randn(4096, 4096)
    nbytes = host.numel() * 4
    pageable = gpu_model.host_copy_gbs(T4, pinned=False) * 1e9
    fixed = gpu_model.HOST_COPY_LATENCY_US * 1e-6  # the copy engine's time per copy
    torch.cuda.synchronize()
    t0 = simulated.modeled_time()
    dev = host.to("cuda:1")  # pageable host memory, staged: the host waits for the copy
    assert simulated.modeled_time() - t0 == pytest.approx(LAUNCH + fixed + nbytes / pageable)
    t0 = simulated.modeled_time()
    back = dev.cpu()  # into pageable memory, staged too
    assert simulated.modeled_time() - t0 == pytest.approx(LAUNCH + fixed + nbytes / pageable + SYNC)
    assert torch.equal(back, host)
    pinned = host.pin_memory()
    t0 = simulated.modeled_time()
    pinned.to("cuda:1", non_blocking=True)  # pinned: at the link's rate, the host goes on
    torch.cuda.synchronize()
    assert simulated.modeled_time() - t0 == pytest.approx(
        LAUNCH + fixed + nbytes / (T4.host_link_gbs * 1e9) + SYNC)
    t0 = simulated.modeled_time()
    dev.to("cuda:0")
    torch.cuda.synchronize()
    assert simulated.modeled_time() - t0 == pytest.approx(
        LAUNCH + nbytes / (T4.peer_link_gbs * 1e9) + SYNC)


def test_backward_and_optimizer_kernels_are_charged_on_their_gpus(t4) -> None:
    l1, l2 = nn.Linear(256, 256).to("cuda:0"), nn.Linear(256, 1).to("cuda:1")
    opt = torch.optim.SGD([*l1.parameters(), *l2.parameters()], lr=0.1)
    x = torch.randn(64, 256, device="cuda:0")

    def step() -> None:
        opt.zero_grad()
        l2(l1(x).to("cuda:1")).sum().backward()
        opt.step()

    ops = simulated.explain(step).ops
    names = [(op.op, op.device) for op in ops]
    for gpu in (0, 1):  # each layer's product, forward then backward, on its own GPU
        assert ("aten::linear", gpu) in names and ("aten::linear (backward)", gpu) in names
    for gpu, products in ((0, 1), (1, 2)):
        # l1's input needs no gradient: its weight's product and its bias's sum; l2 also
        # passes the gradient back to its input, a second product.
        backward = [op.kernel for op in ops if op.op == "aten::linear (backward)"
                    and op.device == gpu]
        forward = next(op for op in ops if op.op == "aten::linear" and op.device == gpu)
        assert sorted(k.family for k in backward) == [GEMM] * products + ["reduction"]
        assert all(k.flops == forward.flops > 0 for k in backward if k.family == GEMM)
    assert any(op.op.startswith("aten::_foreach") and op.device == 1 for op in ops)
    assert any("GPU:0→GPU:1" in op.op for op in ops) and any("GPU:1→GPU:0" in op.op for op in ops)


def test_the_clock_costs_each_call_by_what_it_is_called_on() -> None:
    # The clock keeps a call's cost by its tensors' shapes, dtypes and gradients (a training
    # step's ops come back every step): a repeated call costs what it cost, and a call on other
    # shapes, another dtype, with gradients, or with torch's TF32 switch turned, costs anew.
    devlab.config.simulate_gpus(1, model="A100")
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    try:
        a, b = torch.randn(512, 512, device="cuda"), torch.randn(512, 2048, device="cuda")
        w = torch.randn(512, 512, device="cuda", requires_grad=True)

        def kernels(fn) -> list:
            return [op.kernel for op in simulated.explain(fn).ops]

        matmul.allow_tf32 = False
        first, again = kernels(lambda: a @ a), kernels(lambda: a @ a)
        assert first == again and first[0].flops == 2 * 512**3
        assert kernels(lambda: a @ b)[0].flops == 4 * first[0].flops
        assert kernels(lambda: a.double() @ a.double())[-1] != first[0]
        matmul.allow_tf32 = True
        tf32 = kernels(lambda: a @ a)[0]  # on TF32 tensor cores
        assert tf32.achieved_tflops > 4 * first[0].achieved_tflops and tf32.seconds < first[0].seconds
        matmul.allow_tf32 = False
        # With a weight that needs a gradient, the backward pass charges its product too.
        back = [op.op for op in simulated.explain(lambda: (a @ w).sum().backward()).ops]
        assert back.count("aten::matmul (backward)") == 1
        assert "aten::matmul (backward)" not in [
            op.op for op in simulated.explain(lambda: (a @ a).sum()).ops]
    finally:
        matmul.allow_tf32 = before
        devlab.config.stop_simulation()


def test_attribute_reads_and_writes_launch_no_kernel(t4) -> None:
    p = nn.Parameter(torch.randn(256, 256, device="cuda:0"))
    p.grad = torch.ones_like(p)
    other = torch.randn(256, 256, device="cuda:1")

    def metadata() -> None:
        read = (p.grad.shape, p.dtype, p.requires_grad)
        p.grad = None  # what zero_grad does
        assert read == ((256, 256), torch.float32, True)
        p.data = other  # what Module._apply does across devices, as on CUDA

    assert simulated.explain(metadata).ops == []
    assert p.device == torch.device("cuda:1")


def test_host_work_charges_no_kernel_and_real_time_is_untouched(t4) -> None:
    # (At the wall clock's pace it is the host's time: tests/test_host_clock.py.)
    perf_counter = time.perf_counter
    cpu = torch.randn(512, 512)
    assert simulated.explain(lambda: cpu @ cpu).ops == []
    assert time.perf_counter is perf_counter


def test_a_thread_started_while_modeling_is_charged_too(t4) -> None:
    x = torch.randn(1024, 1024, device="cuda:1")
    seen = []
    t = threading.Thread(target=lambda: seen.append(simulated.explain(lambda: x @ x).bound))
    t.start()
    t.join()
    assert seen == ["compute-bound"]


# --- explain, labels and honesty -----------------------------------------------------------

def _op_row(e: object, op: str) -> list[str]:
    """explain()'s row for `op` (on a loaded machine a row for the GPU waiting on the host may
    come first)."""
    return next(r for r in e.rows() if r[0] == op)  # type: ignore[attr-defined]


def test_explain_breaks_an_op_into_launch_waves_achieved_rate_and_floor(t4) -> None:
    x = torch.randn(2048, 2048, device="cuda:0")
    e = simulated.explain(lambda: x @ x)
    (op,) = e.ops
    k = _product(2048)
    assert (op.op, op.device, op.bound) == ("aten::matmul", 0, "compute-bound")
    assert e.total == pytest.approx(LAUNCH + k.seconds) and op.alone == pytest.approx(k.alone)
    row = dict(zip(e.HEADERS, _op_row(e, "aten::matmul"), strict=True))
    assert row["waves"] == f"{k.waves} × {k.slots} tiles (last {k.last_wave:.0%} full)"
    assert row["achieved"] == f"{k.achieved_tflops:.3g} TFLOPS"
    assert row["alone (CUDA events)"] == f"{k.alone * 1e6:,.2f} µs"
    text = str(e)
    assert "Modeled from NVIDIA T4 (16 GB, PCIe) specifications, not measured." in text
    assert "Times: queued back to back" in text and "if each op were timed alone" in text
    assert "compute-bound" in e._repr_html_()
    y = torch.randn(8, device="cuda:0")
    small = simulated.explain(lambda: y + 1)
    assert small.bound == "launch-bound"
    # The bandwidth curve: a tiny op gets a sliver of the achieved bandwidth.
    got, of = _op_row(small, "aten::add")[7].replace(" GB/s", "").split(" of ")
    assert float(got) < 0.01 * float(of.replace(",", ""))


def test_explain_shows_the_rate_a_short_batched_product_runs_at_on_a_t4(t4) -> None:
    a = torch.randn(8, 512, 512, device="cuda:0")
    e = simulated.explain(lambda: torch.bmm(a, a))
    k = gpu_model.predict("bmm", ((8, 512, 512), (8, 512, 512)), "float32", "T4")
    assert k.clock == pytest.approx(CALIBRATION["T4"].bmm.burst ** 0.5) and k.clock > 1
    row = dict(zip(e.HEADERS, _op_row(e, "aten::bmm"), strict=True))
    assert row["achieved"] == (f"{k.achieved_tflops * k.clock:.3g} TFLOPS (short on a "
                               f"slot-powered board: {k.clock:.2f}x its fitted rate)")
    assert e.ops[0].alone == pytest.approx(k.alone)


def test_every_modeled_figure_says_it_is_modeled(t4) -> None:
    x = torch.randn(256, 256)
    comparison = timing.compare(lambda: x.to(torch.get_default_device()) @ x.to(
        torch.get_default_device()), ["/CPU:0", "/GPU:0"], min_time=0.02)
    gpu = comparison["GPU:0 (modeled T4)"]
    assert gpu.modeled == "NVIDIA T4 (16 GB, PCIe)" and comparison.baseline.modeled is None
    assert "modeled from NVIDIA T4 (16 GB, PCIe) specifications, not measured" in str(gpu)
    assert "CPU:0 measured on this machine" in comparison.note
    assert torch.cuda.get_device_name(1) == "Simulated GPU (modeled T4, CPU-backed)"
    assert "modeled from NVIDIA T4" in devlab.config.gpu_status()
    table = devlab.core.inventory.device_table().text()
    # A T4's memory as torch reports it (15,835,660,288 bytes), not its datasheet's 16 GB.
    assert "simulated, modeled T4" in table and "14.7 GiB" in table


def test_wrong_model_names_fail_clearly() -> None:
    with pytest.raises(ValueError, match="no performance model for a GPU named 'A10'; the "
                                         "models are T4, P4, P100, V100, L4, A100-40GB, "
                                         "A100-80GB, A100-PCIe-40GB, A100-PCIe-80GB, H100, "
                                         "H100-PCIe, TITAN-RTX, RTX-3060, .*, B200 \\(and "
                                         "A100 = A100-80GB, 3060 = RTX-3060, "):
        devlab.config.simulate_gpus(2, model="A10")
    assert not simulated.is_active()
    with pytest.raises(RuntimeError, match="no modeled GPU"):
        simulated.modeled_time()
    simulated.start(1)
    with pytest.raises(RuntimeError, match="simulate_gpus\\(2, model='T4'\\)"):
        simulated.explain(lambda: None)


def test_model_names_are_case_insensitive_and_listed() -> None:
    assert simulated.models() == gpu_model.models() == list(SPECS)
    assert {"T4", "P100", "V100", "L4", "A100-40GB", "A100-80GB", "H100"} <= set(SPECS)
    devlab.config.simulate_gpus(1, model="a100")  # plain "A100": the SXM4 80 GB board
    assert simulated.model().name == "A100-80GB" and simulated.model().memory_gb == 80
    devlab.config.simulate_gpus(1, model="A100-40gb")
    assert simulated.model().full_name == "NVIDIA A100 SXM4 40 GB"
    assert simulated.model().memory_gb == 40 and simulated.model().memory_bandwidth_gbs == 1555


def test_timing_the_cpu_runs_without_the_simulations_modes(t4) -> None:
    seen = []

    def fn() -> None:
        seen.append((torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack()))

    before = (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack())
    assert before == (1, 0)
    timing.time_on_device(fn, "cpu", warmup=0, repeats=1, min_time=0, number=1)
    # The first, untimed call runs under devlab.timing's own watch of where the work runs.
    assert seen[0] == (1, 0) and set(seen[1:]) == {(0, 0)}
    assert (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack()) == before


@pytest.mark.usefixtures("modeled_host")
def test_stop_removes_the_clock() -> None:
    devlab.config.simulate_gpus(2, model="T4")
    torch.ones(3, device="cuda:0")
    assert simulated.modeled_time() > 0
    devlab.config.stop_simulation()
    assert simulated.model() is None and torch._C._len_torch_function_stack() == 0
    devlab.config.simulate_gpus(1, model="T4")
    assert simulated.modeled_time() == 0  # a new simulation's clock starts at 0


def test_the_environment_chooses_a_model(monkeypatch) -> None:
    monkeypatch.setenv("DEVLAB_SIMULATE_GPUS", "2")
    monkeypatch.setenv("DEVLAB_SIMULATE_GPU_MODEL", "L4")
    assert devlab.config.simulate_from_environment()
    assert simulated.model().name == "L4"


# --- the chapter's lessons, on a modeled T4, whatever this machine's cores -----------------

def test_the_crossover_lies_between_64_and_2048(t4, monkeypatch) -> None:
    # The CPU's side from a fixed table (a CPU like CI's: 2 µs a call, 60 GFLOP/s), so load
    # on the machine cannot move the crossover; the T4's side is the model's own.
    import importlib

    matmul = importlib.import_module("devlab.fronts.lab.exercises.matmul")
    modeled = matmul._time_product

    def cpu_table(a, device, options):
        if device.type != "cpu":
            return modeled(a, device, options)
        per_call = 2e-6 + 2 * a.shape[0] ** 3 / 60e9
        return timing.TimingResult("CPU:0", "cpu", [per_call] * 3, 1, 1, "none")

    monkeypatch.setattr(matmul, "_time_product", cpu_table)
    r = exercises.matmul_cpu_vs_gpu(sizes=(16, 32, 64, 128, 256, 512, 1024, 2048),
                                    min_time=0.05, progress=False)
    assert r.data["crossover"] is not None and 64 <= r.data["crossover"] <= 2048, r
    assert r.data["bound"][0] == "launch-bound" and r.data["bound"][-1] == "compute-bound"
    assert "is launch-bound" in str(r) and "compute-bound" in str(r)


def test_a_host_sync_per_step_costs_at_least_twice_the_on_device_log(t4) -> None:
    r = exercises.norm_logging(n=200, progress=False)
    per_step, on_device = (v["time"] for v in r.data["versions"])
    assert per_step >= 2 * on_device, r
    assert "pays the round trip of waking up" in str(r)
    assert f"at least {gpu_model.HOST_COPY_LATENCY_US:g} µs on the GPU" in str(r)


def test_two_modeled_gpus_scale_whatever_the_cores(t4, monkeypatch) -> None:
    from devlab.fronts.lab.exercises import scaling

    monkeypatch.setattr(scaling, "cpu_cores", lambda: 1)  # as on a one-core Binder
    r = exercises.two_gpu_scaling(size=1024, repeats=3, progress=False)
    assert r.data["speedup"] >= 1.8 and r.data["asynchronous_launch"], r
    assert r.data["bound"] == "compute-bound"
    assert "two GPUs, two queues" in str(r)


# --- the model against measured kernels and whole models (docs/gpu-models.md) ------------------

def _benchmark():
    """benchmarks/gpu_model.py and its gpu_measurements, imported from their files."""
    import importlib.util
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))  # gpu_model.py imports gpu_measurements beside it
    try:
        spec = importlib.util.spec_from_file_location("gpu_model_validation",
                                                      bench / "gpu_model.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(bench))
    return module, bench.parent / "docs" / "gpu-models.md"


@pytest.fixture(scope="module")
def bench():
    module, _ = _benchmark()
    if module.gm.data_dir() is None:
        pytest.skip("no gpu-measurements directory (../shared/gpu-measurements or "
                    "$DEVLAB_GPU_MEASUREMENTS): NeuSight's tables are not here")
    return module


@pytest.fixture(scope="module")
def measured(bench):
    return bench.gm.load()


@pytest.fixture(scope="module")
def held_out(bench, measured):
    return bench.gm.held_out(measured)


@pytest.fixture(scope="module")
def sections(bench, measured, held_out):
    return bench.sections(measured, held_out)


def test_the_docs_show_what_the_benchmark_computes(bench, sections) -> None:
    _, doc = _benchmark()
    text = doc.read_text(encoding="utf-8")
    for name, table in sections.items():
        shown = text.split(f"<!-- {name}:start -->")[1].split(f"<!-- {name}:end -->")[0]
        assert shown.strip() == table.strip(), name
    rows = bench.rows()
    assert {"T4", "A100-80GB", "H100", "L4", "P100", "V100"} <= {r.gpu for r in rows}
    assert {r.section for r in rows} >= {"matmul", "memory", "host", "latency"}


def test_every_gpu_and_op_family_meets_the_target(bench, measured) -> None:
    scores = bench.gm.table(measured)
    assert {(s.gpu, s.family) for s in scores} >= {(g, f) for g in ("T4", "L4", "P100", "V100")
                                                   for f in bench.gm.FAMILIES}
    assert sum(s.rows for s in scores) == len(measured) > 25_000
    # The P4's batched products with 64 output columns (2.5x slower than the rest of its rows
    # had the tiles cut to the shape) meet it since its batched fit runs one whole kernel.
    assert [(s.gpu, s.family) for s in scores if not s.meets()] == []
    for s in scores:
        assert s.within_2x >= 0.85 and s.mape <= 0.25 and 0.8 <= s.median_ratio <= 1.25, s


def test_unseen_gpus_in_neusights_protocol(bench, held_out) -> None:
    scores, _ = held_out
    by = {(s.gpu, s.family): s for s in scores}
    assert {g for g, _ in by} == set(bench.gm.HELD_OUT)
    # Fitted on five older GPUs, the rule carries over to the H100 and the A100 80 GB; the L4's
    # FP32 products do twice the work per watt of any of the five (docs say so).
    for (gpu, _), s in by.items():
        if gpu != "L4":
            assert s.meets(), s
    assert by[("L4", "element-wise")].meets() and not by[("L4", "linear")].meets()


def test_the_stored_constants_are_what_the_measurements_give(bench, measured) -> None:
    cals, _ = bench.gm.fit(measured, keep_tiles=True)
    for gpu, fitted in cals.items():
        stored = CALIBRATION[gpu]
        for kind in ("mm", "bmm"):
            assert getattr(fitted, kind).fp32 == pytest.approx(getattr(stored, kind).fp32,
                                                               abs=0.006), (gpu, kind)
        for field in ("bandwidth", "softmax", "layer_norm"):
            assert getattr(fitted, field) == pytest.approx(getattr(stored, field), abs=0.002)
        assert fitted.alone_floor_us == pytest.approx(stored.alone_floor_us, abs=0.15)
        assert (fitted.large_operand is None) == (stored.large_operand is None)
    # The SXM4 boards take their PCIe card's fractions, to their own peaks and bandwidth.
    assert CALIBRATION["A100-80GB"].mm == CALIBRATION["A100-PCIe-80GB"].mm


def test_gpt2_large_whole_forward_passes_within_25_percent(bench, measured) -> None:
    rows = bench.e2e_rows()
    assert {g for g, *_ in rows} >= {"T4", "L4", "P100", "V100", "A100-PCIe-40GB", "H100"}
    for gpu, batch, ms, model in rows:
        assert 0.75 <= model / ms <= 1.25, (gpu, batch, ms, model)
    checks = bench.block_checks(measured)
    assert {c.gpu for c in checks} >= {"T4", "L4", "A100-PCIe-40GB"}
    for c in checks:
        assert 0.75 <= c.ratio <= 1.25 and c.covered >= 18, c


class _GPT2Block(nn.Module):
    """A GPT-2 block as Hugging Face's eager GPT2Block runs it (inference)."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.c_attn, self.c_proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.c_fc, self.mlp_proj = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = (t.view(b, s, self.heads, d).transpose(1, 2)
                   for t in self.c_attn(self.ln_1(x)).split(h, dim=2))
        att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
        att = torch.where(mask, att, torch.finfo(att.dtype).min).softmax(-1)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, s, h)
        x = x + self.c_proj(y)
        u = self.c_fc(self.ln_2(x))
        u = 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * torch.pow(u, 3))))
        return x + self.mlp_proj(u)


def test_a_blocks_modeled_time_is_the_per_op_model_of_its_ops(t4) -> None:
    batch, seq, hidden, heads = 2, 256, 256, 4
    block = _GPT2Block(hidden, heads).to("cuda:0")
    x = torch.randn(batch, seq, hidden, device="cuda:0")
    mask = torch.ones(seq, seq, dtype=torch.bool, device="cuda:0").tril()
    with torch.no_grad():
        e = simulated.explain(lambda: block(x, mask))
        torch.cuda.synchronize()
        t0 = simulated.modeled_time()
        block(x, mask)
        torch.cuda.synchronize()
        clocked = simulated.modeled_time() - t0 - SYNC
    bench, _ = _benchmark()
    ops = bench.gpt2_block(batch, seq, hidden, heads)
    pure = bench.kernels(ops, "T4")
    # Every product the clock charged is the per-op model's product of the same shape.
    charged = sorted(round(op.compute, 12) for op in e.ops if op.kernel.family == GEMM)
    assert charged == sorted(round(k.compute, 12) for k in pure if k.family == GEMM)
    assert len(charged) == 6
    # The block's queued time on the clock is the per-op model's sum (the matmuls' reshape
    # copies, which torch makes inside C++, are the only ops the clock does not see).
    expected = bench.queued_seconds(ops, "T4")
    assert clocked == pytest.approx(expected, rel=0.10)


# --- the boards of issue 40, the datasheet rule, leaving each measured board out, bands -------

NEW_BOARDS = ("RTX-3060", "RTX-3090", "RTX-4060", "RTX-4070", "RTX-4090", "RTX-5090", "A10G",
              "L40S", "V100-SXM2-16GB", "H200", "B200")

def test_compute_capability_10_and_12_as_torch_reads_them() -> None:
    """The B200 (10.0) and RTX 5090 (12.0) as torch 2.13's own checks see them: BF16 from
    major 8 on (torch.cuda.is_bf16_supported), FP8 from 8.9 (common_cuda's
    PLATFORM_SUPPORTS_FP8), MX/FP4 products from 10.0 (SM100OrLater), flash attention over
    sm80 to sm121 (sdp_utils.cpp); FP64 tensor cores on the data-centre chip only."""
    from devlab.engine.gpu_model.specs import ARCH
    b200, rtx5090 = SPECS["B200"], SPECS["RTX-5090"]
    assert (b200.compute_capability, rtx5090.compute_capability) == ("10.0", "12.0")
    for s in (b200, rtx5090):
        major, minor = (int(x) for x in s.compute_capability.split("."))
        assert major >= 8 and s.bf16_tflops is not None and "bfloat16" in s.tensor_dtypes
        assert (8, 0) <= (major, minor) <= (12, 1)  # flash attention's range
        assert {"float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2"} <= set(s.tensor_dtypes)
    assert "float64" in b200.tensor_dtypes and "float64" not in rtx5090.tensor_dtypes
    # Per-SM limits: sm_100 as sm_90, sm_120 as sm_89 (NVIDIA's libcu++ arch_traits).
    assert ARCH["10.0"] == ARCH["9.0"] and ARCH["12.0"] == ARCH["8.9"]



@pytest.mark.parametrize(("typed", "key"), [
    ("RTX 4090", "RTX-4090"), ("4090", "RTX-4090"), ("GeForce RTX 4090", "RTX-4090"),
    ("NVIDIA GeForce RTX 3090", "RTX-3090"), ("rtx-3060-12gb", "RTX-3060"), ("H200", "H200"),
    ("b200", "B200"), ("A10G", "A10G"), ("NVIDIA L40S", "L40S"), ("V100 SXM2 16GB",
    "V100-SXM2-16GB"), ("V100-16GB", "V100-SXM2-16GB"), ("Tesla T4", "T4"), ("A100", "A100-80GB"),
    ("a100-pcie-40gb", "A100-PCIe-40GB")])
def test_boards_are_found_by_the_names_people_type(typed: str, key: str) -> None:
    assert gpu_model.gpu(typed).name == key
    assert simulated.gpu_spec(typed).name == key


def test_every_new_board_has_its_datasheet_figures() -> None:
    from devlab.engine.gpu_model.capacity import TOTAL_MEMORY
    from devlab.engine.gpu_model.links import topologies
    for key in NEW_BOARDS:
        s = SPECS[key]
        assert s.sms > 0 and s.board_power_w > 0 and s.base_clock_mhz < s.boost_clock_mhz
        assert s.process_nm > 0 and s.l2_cache_mb > 0 and s.fp32_lanes_per_scheduler in (16, 32)
        assert s.pcie_gen in (3, 4, 5) and f"PCIe Gen{s.pcie_gen}" in s.host_link
        # The FP32 peak is the lanes at the boost clock: within 3 % of cores x 2 x clock
        # (cores = SMs x 128, or 64 on Volta), the datasheet's own arithmetic.
        per_sm = 64 if s.compute_capability == "7.0" else 128
        peak = s.sms * per_sm * 2 * s.boost_clock_mhz * 1e6 / 1e12
        assert peak == pytest.approx(s.fp32_tflops, rel=0.03), key
        assert ("float16" in s.tensor_dtypes) and (("bfloat16" in s.tensor_dtypes)
                                                   == (s.bf16_tflops is not None))
        # torch's capacity is a little under the datasheet's GB (the driver keeps some).
        assert 0.85 * s.memory_gb * 1e9 < TOTAL_MEMORY[key] < s.memory_gb * 1e9 * 1.08, key
        assert topologies(key)
    # The links each is sold with: NVLink on the 3090 pair, none on the 4090 and 5090,
    # NVSwitch in the H200 and B200 servers.
    def nvlink(key: str) -> list[str]:
        return [t.key for t in topologies(key) if t.hw == "NVLink"]

    assert nvlink("RTX-3090") == ["nvlink3-3090-bridge"]
    assert nvlink("RTX-4090") == nvlink("RTX-5090") == nvlink("RTX-4060") == []
    assert nvlink("H200") == ["nvswitch-h100"] and nvlink("B200") == ["nvswitch-b200"]


def test_the_documented_capacities_are_the_models(bench) -> None:
    from devlab.engine.gpu_model.capacity import TOTAL_MEMORY
    _, doc = _benchmark()
    text = doc.read_text(encoding="utf-8")
    for key in NEW_BOARDS:
        assert f"| {key} | {TOTAL_MEMORY[key]:,} |" in text, key


def test_a_new_board_is_a_modeled_gpu_torch_sees_as_that_board() -> None:
    from devlab.engine.gpu_model.capacity import TOTAL_MEMORY
    devlab.config.simulate_gpus(1, model="GeForce RTX 4090")
    try:
        assert torch.cuda.get_device_capability(0) == (8, 9)
        props = torch.cuda.get_device_properties(0)
        assert props.total_memory == TOTAL_MEMORY["RTX-4090"]
        assert "RTX-4090" in props.name
        x = torch.randn(256, 256, device="cuda")
        e = simulated.explain(lambda: x @ x)
        assert e.band.startswith("Band: modeled from the datasheet")
        assert "no kernels measured on the RTX-4090" in e.band
        assert _op_row(e, "aten::matmul")[-1].endswith("x*")
    finally:
        devlab.config.stop_simulation()


def test_bands_say_where_the_model_stops() -> None:
    from devlab.engine.gpu_model.band import band
    inside = band(_product(2048), SPECS["T4"])
    assert inside.measured_board and not inside.outside and inside.lo < 1 < inside.hi
    assert inside.text.startswith("fitted on this board's own measured kernels")
    other = band(_product(2048, "RTX-4090"), SPECS["RTX-4090"])
    assert not other.measured_board and "RTX-4090" in other.outside
    assert other.text.startswith("modeled from the datasheet; kernels of this size measured on")
    half = band(_product(2048, "T4", "float16"), SPECS["T4"], fp32=False)
    assert "dtype" in half.outside
    huge = band(_product(65536), SPECS["T4"])
    assert "size outside" in huge.outside
    # The model's answer carries it too, and the band's kinds are the model's families.
    assert _product(2048, "RTX-4090").band("RTX 4090") == other
    from devlab.engine.gpu_model import band as band_module
    assert set(band_module._KIND) == {GEMM, SOFTMAX, LAYER_NORM}
    # A band from boards left out is never narrower than the board's own, size for size.
    from devlab.engine.gpu_model.band import IN_SAMPLE, LEAVE_ONE_OUT
    assert set(IN_SAMPLE) == set(LEAVE_ONE_OUT)
    wider = sum(LEAVE_ONE_OUT[k][1] / LEAVE_ONE_OUT[k][0] >= IN_SAMPLE[k][1] / IN_SAMPLE[k][0]
                for k in IN_SAMPLE)
    assert wider >= 0.75 * len(IN_SAMPLE)


@pytest.fixture(scope="module")
def loo(bench, measured):
    return bench.gm.leave_one_out(measured)


def test_the_datasheet_rule_is_what_the_measurements_give(bench, measured, loo) -> None:
    from devlab.engine.gpu_model.band import IN_SAMPLE, LEAVE_ONE_OUT
    from devlab.engine.gpu_model.calibration import DATASHEET_RULE, MEASURED, from_datasheet
    gm = bench.gm
    fitted = gm.fit_datasheet_rule({g: CALIBRATION[g] for g in MEASURED}, gm.MEMORY_MEASURED)
    assert fitted == DATASHEET_RULE
    for key in NEW_BOARDS:
        assert CALIBRATION[key] == from_datasheet(SPECS[key])
    _, got = loo
    assert gm.bands(gm.loo_ratios(measured, got), got.__getitem__) == LEAVE_ONE_OUT
    assert gm.bands(((r, gm.predict(r).alone / r.measured) for r in measured),
                    CALIBRATION.__getitem__) == IN_SAMPLE


# Where the leave-one-out table misses the 20 % target (docs/gpu-models.md says why): each is
# a board x family; the test fails if one more appears or one of these is met.
LOO_ERROR_MISSES: set[tuple[str, str]] = set()


def test_leaving_each_measured_board_out(bench, measured, loo) -> None:
    scores, _ = loo
    assert {s.gpu for s in scores} == set(bench.gm.MEASURED)
    assert sum(s.rows for s in scores) == len(measured)
    assert {(s.gpu, s.family) for s in scores if s.mape > 0.2} == LOO_ERROR_MISSES
    assert [(s.gpu, s.family) for s in scores if s.within_2x < 0.9] == []
    # Softmax and layer norm, with the rows read against the L2, meet the target everywhere.
    assert all(s.meets(0.9, 0.2) for s in scores if s.family in ("softmax", "layer norm"))
    for s in scores:
        assert s.within_2x >= 0.85 and s.mape <= 0.35 and 0.6 <= s.median_ratio <= 1.3, s
    # Against the previous rule fitted the same way: every kernel's error together is lower,
    # and the L4 (twice as fast per watt as the older boards) now meets the target on products.
    before = bench.old_rule_loo(measured)

    def mean(ss: list) -> float:
        return sum(s.mape * s.rows for s in ss) / sum(s.rows for s in ss)

    assert mean(scores) < 0.8 * mean(before)
    by = {(s.gpu, s.family): s for s in scores}
    assert by[("L4", "linear")].meets(0.9, 0.2) and by[("L4", "bmm")].within_2x >= 0.9
    # A board's own constants stay better than its leave-one-out ones, family by family.
    own = {(s.gpu, s.family): s for s in bench.gm.table(measured)}
    assert mean(list(own.values())) < mean(scores)


def test_published_runs_on_the_new_boards(bench) -> None:
    # The boards' own work: the host's launch and sync latencies and a small copy's fixed time
    # are one value for every board (docs/gpu-models.md, "Launch and sync latencies", "Copies
    # between host and GPU"), held within 2x on their own rows.
    rows = [r for r in bench.rows()
            if r.gpu in NEW_BOARDS and r.section not in ("latency", "small copy")]
    assert {r.gpu for r in rows} == set(NEW_BOARDS)
    # The plain RTX 4070's: two cuBLAS SGEMM runs (no torch run of it is published: docs), one
    # at n = 4096, one at each size from 256 to 4096 (their GFLOP/s).
    rtx4070 = {r.what: round(r.published * 1000) for r in rows if r.gpu == "RTX-4070"}
    assert sorted(rtx4070.values()) == [2050, 7976, 15428, 17850, 21900, 22050]
    assert [sum(f"[{s}]" in what for what in rtx4070) for s in ("stefanind", "Bl4ckd09")] == [1, 5]
    for r in rows:
        assert 0.7 <= r.ratio <= 1.4, (r.gpu, r.what, r.published, r.model)
