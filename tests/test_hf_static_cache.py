"""Hugging Face static-cache generation on simulated GPUs (issue 29), as transformers' users
write it: `model.generate(..., cache_implementation="static")`, and a `StaticCache` whose
one-token decoding step is captured in a CUDA graph with `torch.cuda.graph` and replayed (the
pattern of transformers' "static kv-cache and torch.compile" docs and gpt-fast, with the graph
made by hand instead of by torch.compile's reduce-overhead mode).

The models are tiny ones built from configs with a seed (the Hugging Face hub is not reached),
and every run is compared with the same greedy generation on the CPU: a simulated GPU computes
with the CPU's kernels, so tokens and logits must be equal, not close.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

# The test extra installs transformers; the compatibility jobs leave it out (tools/compat.py).
pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    StaticCache,
)

import devlab  # noqa: E402
from devlab.engine.simulated.mode import compile_stance as _compile  # noqa: E402

MAX_CACHE = 16
NEW_TOKENS = 6
# Two prompts, the first left-padded (pad id 0), as a batch is given to generate.
PROMPTS = [[0, 0, 9, 17, 33], [3, 5, 9, 17, 33]]


def _llama(device: str) -> PreTrainedModel:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                         eos_token_id=None)
    return LlamaForCausalLM(config).eval().to(device)


def _gpt2(device: str) -> PreTrainedModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                        pad_token_id=0, bos_token_id=1, eos_token_id=None)
    return GPT2LMHeadModel(config).eval().to(device)


MODELS: dict[str, Callable[[str], PreTrainedModel]] = {"llama": _llama, "gpt2": _gpt2}


def _generate(make: Callable[[str], PreTrainedModel],
              device: str) -> tuple[list[list[int]], list[torch.Tensor]]:
    """generate() with a static cache, greedy; the sequences and each step's logits."""
    model = make(device)
    ids = torch.tensor(PROMPTS, device=device)
    out = model.generate(ids, attention_mask=(ids != 0).long(), max_new_tokens=NEW_TOKENS,
                         do_sample=False, cache_implementation="static",
                         return_dict_in_generate=True, output_logits=True)
    return out.sequences.tolist(), [lg.cpu() for lg in out.logits]


@pytest.mark.parametrize("name", list(MODELS))
def test_generate_with_a_static_cache_gives_the_cpus_tokens_and_logits(
        no_simulation, capfd, name) -> None:
    cpu_tokens, cpu_logits = _generate(MODELS[name], "cpu")
    devlab.simulated.start(1)
    _compile._notice.told.clear()
    _compile._graphs_notice.told.clear()
    tokens, logits = _generate(MODELS[name], "cuda")
    assert tokens == cpu_tokens
    assert len(logits) == NEW_TOKENS
    for got, want in zip(logits, cpu_logits, strict=True):
        assert torch.equal(got, want)
    assert len({tuple(row[len(PROMPTS[0]):]) for row in tokens}) > 1  # the prompts differ
    # On a GPU, generate compiles the decoding step with CUDA graphs (transformers'
    # CompileConfig: mode="reduce-overhead"); devlab runs it uncompiled and says so, once.
    err = capfd.readouterr().err
    assert err.count("torch.compile runs the code uncompiled") == 1
    assert err.count("torch.compile's CUDA graphs (mode='reduce-overhead') are not made") == 1


def _decode(make: Callable[[str], PreTrainedModel], device: str, graphed: bool,
            prompts: list[list[int]]) -> tuple[list[list[int]], list[torch.Tensor], object]:
    """Greedy decoding of each prompt batch in turn through one StaticCache (reset between
    batches): the prefill eagerly, then NEW_TOKENS one-token steps on static tensors (the
    token, its position, the attention mask over the whole cache). Graphed, the step is
    captured once, on the first batch, and replayed for every step of every batch; else it
    runs eagerly. The tokens, each step's logits, and the graph (None if not graphed)."""
    model = make(device)
    cache = StaticCache(config=model.config, max_cache_len=MAX_CACHE)
    batch = len(prompts[0])
    static_token = torch.zeros(batch, 1, dtype=torch.long, device=device)
    static_position = torch.zeros(1, dtype=torch.long, device=device)
    static_position_ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
    static_mask = torch.zeros(batch, MAX_CACHE, dtype=torch.long, device=device)

    def step() -> torch.Tensor:
        return model(static_token, attention_mask=static_mask, position_ids=static_position_ids,
                     cache_position=static_position, past_key_values=cache,
                     use_cache=True).logits

    graph = None
    tokens: list[list[int]] = []
    logits: list[torch.Tensor] = []
    with torch.no_grad():
        for prompt in prompts:
            cache.reset()
            ids = torch.tensor(prompt, device=device)
            length = ids.shape[1]
            static_mask.zero_()
            static_mask[:, :length] = (ids != 0).long()
            position_ids = (static_mask[:, :length].cumsum(-1) - 1).clamp(min=0)
            prefill = model(ids, attention_mask=static_mask, position_ids=position_ids,
                            cache_position=torch.arange(length, device=device),
                            past_key_values=cache, use_cache=True).logits
            static_token.copy_(prefill[:, -1].argmax(-1, keepdim=True))
            static_position.fill_(length)
            static_position_ids.copy_(position_ids[:, -1:] + 1)
            static_mask[:, length] = 1
            new = [static_token.clone()]
            if graphed and graph is None:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    static_logits = step()
            for _ in range(NEW_TOKENS):
                if graph is not None:
                    graph.replay()
                    out = static_logits
                else:
                    out = step()
                logits.append(out.cpu())
                static_token.copy_(out[:, -1].argmax(-1, keepdim=True))
                new.append(static_token.clone())
                static_position.add_(1)
                static_position_ids.add_(1)
                static_mask.index_fill_(1, static_position, 1)
            tokens.extend(torch.cat([ids, *new], 1).tolist())
    return tokens, logits, graph


@pytest.mark.parametrize("name", list(MODELS))
def test_a_decoding_step_captured_in_a_cuda_graph_gives_the_cpus_tokens(no_simulation,
                                                                        name) -> None:
    prompts = [PROMPTS, [[4, 8, 15, 16, 23], [0, 0, 0, 42, 7]]]
    cpu_tokens, cpu_logits, _ = _decode(MODELS[name], "cpu", graphed=False, prompts=prompts)
    devlab.simulated.start(1)
    tokens, logits, graph = _decode(MODELS[name], "cuda", graphed=True, prompts=prompts)
    assert tokens == cpu_tokens  # the second batch too: the graph outlives cache.reset()
    for got, want in zip(logits, cpu_logits, strict=True):
        assert torch.equal(got, want)
    # The cache is written in place by the replays (index_copy_ at the cumulative length the
    # graph reads on the GPU), so the static cache's keys must be among what it runs.
    assert "aten::index_copy_" in graph.recorded_ops
    assert not any(op in graph.recorded_ops for op in ("aten::_local_scalar_dense",
                                                       "aten::nonzero"))


def test_a_replayed_decoding_step_costs_one_launch_on_a_modeled_gpu(no_simulation) -> None:
    devlab.simulated.start(1, model="T4")
    model = _llama("cuda")
    cache = StaticCache(config=model.config, max_cache_len=MAX_CACHE)
    ids = torch.tensor([PROMPTS[1]], device="cuda")
    token = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    position = torch.tensor([ids.shape[1]], device="cuda")
    with torch.no_grad():
        model(ids, cache_position=torch.arange(ids.shape[1], device="cuda"),
              past_key_values=cache)

        def step() -> torch.Tensor:
            return model(token, cache_position=position, past_key_values=cache).logits

        eager = devlab.simulated.explain(step)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        replay = devlab.simulated.explain(graph.replay)
    launch = devlab.simulated.model().launch_latency_us * 1e-6
    kernels = len(eager.ops)
    assert kernels > 50  # a 2-layer Llama step launches many small kernels eagerly
    assert [op.launch for op in eager.ops] == [launch] * kernels
    assert [op.launch for op in replay.ops] == [launch] + [0.0] * (kernels - 1)
    assert [op.gpu for op in replay.ops] == [op.gpu for op in eager.ops]
    assert replay.total == pytest.approx(eager.total - (kernels - 1) * launch)


@pytest.mark.parametrize(("kwargs", "asked"), [
    ({"mode": "reduce-overhead"}, "mode='reduce-overhead'"),
    ({"mode": "max-autotune"}, "mode='max-autotune'"),
    ({"options": {"triton.cudagraphs": True}}, "options={'triton.cudagraphs': True}"),
    ({"backend": "cudagraphs"}, "backend='cudagraphs'"),
    ({"mode": "max-autotune-no-cudagraphs"}, None),
    ({}, None),
])
def test_torch_compile_says_which_argument_asked_for_cuda_graphs(kwargs, asked) -> None:
    """torch's own mode table (`list_mode_options`) is the rule: the modes that set
    triton.cudagraphs are those named."""
    assert _compile.cuda_graphs_asked(kwargs) == asked
    mode = kwargs.get("mode")
    if mode is not None:
        import torch._inductor

        assert (asked is not None) == bool(
            torch._inductor.list_mode_options(mode).get("triton.cudagraphs"))
