"""A communication-bound whole step: GPT-2 fine-tuning with DDP on two modeled TITAN RTX, with
an NVLink bridge and without peer-to-peer, beside Hugging Face's published runs.

Run: .venv/bin/python benchmarks/ddp_gpt2_nvlink.py [--simulate]

By default the step is costed by the pure model (seconds): the forward pass's kernels as
Hugging Face's eager GPT-2 runs them (benchmarks/gpu_model.py's `gpt2_forward`, plus the loss),
the backward pass taken as twice each part's forward (an assumption: no source splits the
step), the gradient clipping's and AdamW's per-parameter kernels, and DDP's buckets through
`gpu_model.data_parallel_step` with each parameter's gradient written when the backward pass
leaves its layer (the LM head's first, the tied embedding's last). `--simulate` runs the same
step on simulated GPUs instead (below): the whole simulation, slow on a CPU (minutes per step
and rank).

The measurement ([hf-hardware]: huggingface/transformers, docs/source/en/perf_hardware.md,
commit 5ea83b0e4bed678bda24e6a1512b7afae30f359a, "Multi-GPU Connectivity"): run_clm.py
fine-tuning `gpt2` (124 M parameters) on wikitext-2 with `--per_device_train_batch_size 4
--max_steps 200`, no `--fp16` (so FP32), DDP on 2 TITAN RTX 24 GB joined by 2 NVLinks (`NV2`);
pytorch-1.8-to-be, CUDA 11.0, transformers 4.3.0.dev0:

- DDP with NVLink: `'train_runtime': 101.9003`;
- DDP with `NCCL_P2P_DISABLE=1` (NCCL stages every byte through host memory): `131.4367`.

run_clm.py's block size is the tokenizer's `model_max_length`, capped at 1024: 1024 tokens for
GPT-2. Its Trainer uses AdamW (weight decay 0 by default, one Python loop over the parameters)
and clips the gradients' norm to 1.0 before each step; dropout 0.1 is on in training.

Here the same step runs on two modeled TITAN RTX (devlab's simulated GPUs, on this machine's
CPU): GPT-2 small as Hugging Face's eager GPT2LMHeadModel of that release runs it (Conv1D
products, attention by matmul, softmax and a causal `where`, the tanh GELU as element-wise
ops, the tied LM head, the shifted cross-entropy), DistributedDataParallel with 25 MiB buckets,
gradient clipping and AdamW, once to warm up (DDP's first iteration has one bucket) and once
timed, on 1 GPU, on 2 joined by `nvlink2-bridge`, and on the same 2 with NCCL_P2P_DISABLE=1 in
the ranks' environment. The per-step figures are modeled (the kernel model, NCCL's tuning
model, DDP's overlap), not measured; x 200 they stand beside the published train_runtime.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import devlab  # noqa: E402
from devlab.engine import simulated  # noqa: E402

# GPT-2 small (openai-community/gpt2's config.json): 12 layers, 12 heads, 768 wide, 1024
# positions, a vocabulary of 50257, dropout 0.1 (embeddings, attention, residuals).
LAYERS, HEADS, WIDTH, POSITIONS, VOCAB, DROPOUT = 12, 12, 768, 1024, 50257, 0.1
BATCH, SEQUENCE, STEPS = 4, 1024, 200  # [hf-hardware]'s command; run_clm.py's block size
PUBLISHED = {"nvlink": 101.9003, "no-p2p": 131.4367}  # train_runtime, s, 200 steps
PUBLISHED_DP = 110.5948  # DataParallel (one process), the same command without DDP


class Conv1D(nn.Module):
    """Hugging Face's Conv1D: a linear layer with its weight stored (in, out), run as addmm."""

    def __init__(self, nx: int, nf: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """transformers' gelu_new (GPT-2's activation), element-wise ops as that release ran it."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.c_attn, self.attn_proj = Conv1D(WIDTH, 3 * WIDTH), Conv1D(WIDTH, WIDTH)
        self.c_fc, self.mlp_proj = Conv1D(WIDTH, 4 * WIDTH), Conv1D(4 * WIDTH, WIDTH)
        self.drop = nn.Dropout(DROPOUT)

    def attention(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.c_attn(x).split(WIDTH, dim=2)
        q, v = (z.view(b, t, HEADS, -1).permute(0, 2, 1, 3) for z in (q, v))
        k = k.view(b, t, HEADS, -1).permute(0, 2, 3, 1)
        w = torch.matmul(q, k) / (float(v.size(-1)) ** 0.5)
        w = torch.where(mask[:, :, :t, :t], w, torch.tensor(-1e4, device=w.device))
        w = self.drop(F.softmax(w, dim=-1))
        a = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous().view(b, t, WIDTH)
        return self.drop(self.attn_proj(a))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln_1(x), mask)
        return x + self.drop(self.mlp_proj(gelu_new(self.c_fc(self.ln_2(x)))))


class GPT2LMHead(nn.Module):
    """GPT2LMHeadModel's training forward: the loss of next-token prediction."""

    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(POSITIONS, WIDTH)
        self.drop = nn.Dropout(DROPOUT)
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.register_buffer("mask", torch.tril(torch.ones(POSITIONS, POSITIONS, dtype=torch.bool))
                             .view(1, 1, POSITIONS, POSITIONS), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        x = self.drop(self.wte(ids) + self.wpe(pos))
        for block in self.h:
            x = block(x, self.mask)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the LM head is tied to wte
        shift = logits[..., :-1, :].contiguous()
        return F.cross_entropy(shift.view(-1, VOCAB), ids[..., 1:].contiguous().view(-1))


def parameters_of() -> int:
    return sum(p.numel() for p in GPT2LMHead().parameters())


def rank_step() -> dict:
    """One rank: DDP over GPT-2 small, a warm-up step, then one step timed on the modeled
    clock; also its forward and backward alone."""
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // int(os.environ["WORLD_SIZE"])))
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(GPT2LMHead().to(rank), device_ids=[rank],
                                                bucket_cap_mb=25)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.0, foreach=False)
    ids = torch.randint(0, VOCAB, (BATCH, SEQUENCE), device=rank)

    def step() -> None:
        loss = model(ids)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
        opt.step()
        opt.zero_grad()

    step()  # DDP's first iteration: one bucket; its buckets are rebuilt after it
    torch.cuda.synchronize()
    dist.barrier()
    t0 = simulated.modeled_time()
    step()
    torch.cuda.synchronize()
    modeled = simulated.modeled_time() - t0
    dist.destroy_process_group()
    return {"modeled": modeled, "topology": simulated.topology()}


def run(ranks: int, p2p: bool) -> float:
    """The modeled step (s) of the slowest rank."""
    devlab.config.simulate_gpus(2, model="TITAN-RTX", topology="nvlink2-bridge")
    saved = os.environ.get("NCCL_P2P_DISABLE")
    if not p2p:
        os.environ["NCCL_P2P_DISABLE"] = "1"  # the ranks inherit it, as torchrun's would
    try:
        results = devlab.launch(rank_step, nprocs=ranks, timeout=3600, start_method="spawn")
    finally:
        if saved is None:
            os.environ.pop("NCCL_P2P_DISABLE", None)
        else:
            os.environ["NCCL_P2P_DISABLE"] = saved
        devlab.config.stop_simulation()
    step = max(r["modeled"] for r in results)
    print(f"    ({ranks} rank(s), {'P2P on' if p2p else 'NCCL_P2P_DISABLE=1'}: "
          f"{results[0]['topology']}, {step * 1e3:.1f} ms)", flush=True)
    return step


def pure_steps() -> dict[str, object]:
    """The pure model's step on 1 GPU and on 2 joined by each machine (StepTime)."""
    from benchmarks.gpu_model import Op, gpt2_block, queued_seconds
    from devlab.engine.gpu_model import data_parallel_step, predict

    gpu, t = "TITAN-RTX", BATCH * SEQUENCE
    head = [Op("ln_f", "layer_norm", ((t, WIDTH),)),
            Op("lm_head (mm)", "mm", ((t, WIDTH), (WIDTH, VOCAB))),
            Op("shifted logits (contiguous)", "copy", (((t - BATCH) * VOCAB,),)),
            Op("log_softmax", "softmax", ((t - BATCH, VOCAB),)),
            Op("nll_loss", "sum", (((t - BATCH) * VOCAB // VOCAB,),))]
    embed = [Op("token embedding", "embedding", ((t, WIDTH),), (t, WIDTH)),
             Op("position embedding", "embedding", ((SEQUENCE, WIDTH),), (SEQUENCE, WIDTH)),
             Op("embeddings add", "add", ((t, WIDTH), (SEQUENCE, WIDTH)), (t, WIDTH))]
    f_head, f_embed = queued_seconds(head, gpu), queued_seconds(embed, gpu)
    f_block = queued_seconds(gpt2_block(BATCH, SEQUENCE, WIDTH, HEADS), gpu)
    forward = f_embed + LAYERS * f_block + f_head
    backward = 2 * forward
    model = GPT2LMHead()
    sizes = {name: p.numel() * 4 for name, p in model.named_parameters()}
    grads, clock = [], 2 * f_head
    grads += [(clock, sizes["ln_f.weight"]), (clock, sizes["ln_f.bias"])]
    for i in reversed(range(LAYERS)):
        clock += 2 * f_block
        grads += [(clock, n) for name, n in sizes.items() if name.startswith(f"h.{i}.")]
    grads += [(backward, sizes["wpe.weight"]), (backward, sizes["wte.weight"])]
    # Clipping (a norm per gradient, then a scale) and AdamW's single-tensor kernels: each
    # moves its tensors' bytes (torch.optim.adamw._single_tensor_adamw, weight decay 0).
    optimizer = 0.0
    for n in sizes.values():
        e = n // 4
        one, two, three = ((e,),), ((e,), (e,)), ((e,), (e,), (e,))
        for op, shapes in (("norm", one), ("mul", two),  # clip: norm, then scale
                           ("lerp", two), ("mul", one), ("addcmul", three),  # moments
                           ("sqrt", one), ("div", one), ("add", one),  # denominator
                           ("addcdiv", three)):  # the update
            k = predict(op, shapes, "float32", gpu)
            optimizer += max(k.seconds, SPECS_LAUNCH)
    steps = {"one": data_parallel_step(grads, 1, "nvlink2-bridge", forward=forward,
                                       backward=backward, optimizer=optimizer, gpu_name=gpu)}
    for key in ("nvlink2-bridge", "pcie3-host"):
        steps[key] = data_parallel_step(grads, 2, key, forward=forward, backward=backward,
                                        optimizer=optimizer, gpu_name=gpu)
    return steps


SPECS_LAUNCH = 4e-6  # a kernel cannot be queued faster than the host launches it (specs.py)


def main_pure() -> None:
    steps = pure_steps()
    one, nvlink, host = steps["one"], steps["nvlink2-bridge"], steps["pcie3-host"]
    print(f"GPT-2 small, {parameters_of() / 1e6:.1f} M parameters, batch {BATCH} x {SEQUENCE} "
          "per GPU, FP32, on modeled TITAN RTX (pure model; every figure modeled):")
    print(f"  one GPU: forward {one.forward * 1e3:.1f} ms, backward {one.backward * 1e3:.1f} ms"
          f" (2x forward, assumed), clip + AdamW {one.optimizer * 1e3:.1f} ms = "
          f"{one.seconds * 1e3:.1f} ms")
    for name, st, published in (("NVLink bridge (nvlink2-bridge)", nvlink, PUBLISHED["nvlink"]),
                                ("NCCL_P2P_DISABLE=1 (pcie3-host)", host, PUBLISHED["no-p2p"])):
        print(f"  2 GPUs, {name:32}: {st.seconds * 1e3:7.1f} ms/step (all-reduce "
              f"{st.communication * 1e3:.1f} ms in {len(st.buckets)} buckets, "
              f"{st.exposed * 1e3:.1f} ms not hidden); x {STEPS} = {st.seconds * STEPS:.1f} s; "
              f"published {published:.1f} s ({published / STEPS * 1e3:.0f} ms/step), "
              f"model / published {st.seconds * STEPS / published:.2f}")
    measured_ratio = PUBLISHED["no-p2p"] / PUBLISHED["nvlink"]
    ratio = host.seconds / nvlink.seconds
    print(f"  without / with NVLink: published {measured_ratio:.3f}, model {ratio:.3f} "
          f"(model / published {ratio / measured_ratio:.3f})")
    print(f"  what NVLink saves per step: published "
          f"{(PUBLISHED['no-p2p'] - PUBLISHED['nvlink']) / STEPS * 1e3:.0f} ms, model "
          f"{(host.seconds - nvlink.seconds) * 1e3:.0f} ms")


def main() -> None:
    if "--simulate" not in sys.argv:
        main_pure()
        return
    n = parameters_of()
    print(f"GPT-2 small, {n / 1e6:.1f} M parameters ({n * 4 / 1e6:.0f} MB of FP32 gradients), "
          f"batch {BATCH} x {SEQUENCE} tokens per GPU, FP32, AdamW, DDP 25 MiB buckets, "
          "on modeled TITAN RTX (every step time here is modeled, not measured):")
    one = run(1, True)
    nvlink = run(2, True)
    host = run(2, False)
    rows = [("1 GPU (no communication)", one, None),
            ("2 GPUs, NVLink bridge (nvlink2-bridge)", nvlink, PUBLISHED["nvlink"]),
            ("2 GPUs, NCCL_P2P_DISABLE=1 (pcie3-host)", host, PUBLISHED["no-p2p"])]
    for name, step, published in rows:
        line = f"  {name:42} {step * 1e3:8.1f} ms/step, x {STEPS} = {step * STEPS:6.1f} s"
        if published is not None:
            line += (f"; published train_runtime {published:.1f} s ({published / STEPS * 1e3:.0f}"
                     f" ms/step); model / published {step * STEPS / published:.2f}")
        print(line)
    measured_ratio = PUBLISHED["no-p2p"] / PUBLISHED["nvlink"]
    model_ratio = host / nvlink
    print(f"  without / with NVLink: published {measured_ratio:.3f}, model {model_ratio:.3f} "
          f"(model / published {model_ratio / measured_ratio:.3f})")
    print(f"  what NVLink saves per step: published "
          f"{(PUBLISHED['no-p2p'] - PUBLISHED['nvlink']) / STEPS * 1e3:.0f} ms, model "
          f"{(host - nvlink) * 1e3:.0f} ms; DDP on NVLink adds {(nvlink - one) * 1e3:.1f} ms "
          "to one GPU's step")


if __name__ == "__main__":
    main()
