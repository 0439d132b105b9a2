"""The decoder stack (tritonlm/worker/model_paths/decoder_stack.py): a step without LoRA adapters goes
through it, and its logits are those of transformers' modules bitwise, in both dtypes, on every
attention backend, over steps that mix prefill chunks, decodes and prompt logits; so for each family
it runs (random 2-layer checkpoints from each family's own config class: Qwen2's biases, Mistral's
sliding window, Qwen3's query and key norms, Granite's multipliers, Phi-3's packed projections and
partial rotary embedding). A model of another family (Gemma, OLMo 2, GPT-2), a runner without fused
projections and a CPU without the kernels keep transformers' path, and so does a step with a LoRA
adapter (whose hooks sit on the projection modules: tests/engine/test_lora.py compares its tokens
with a merged model)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import request, run_all
from transformers import (
    AutoModelForCausalLM,
    GemmaConfig,
    GraniteConfig,
    LlamaConfig,
    MistralConfig,
    Olmo2Config,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)

from tritonlm.config import EngineConfig
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker import cpu_kernels
from tritonlm.worker.model_paths import registry
from tritonlm.worker.model_paths.decoder_stack import FAMILIES, DecoderStack
from tritonlm.worker.model_runner import ModelRunner

pytestmark = pytest.mark.skipif(cpu_kernels.unavailable() is not None, reason=f"{cpu_kernels.unavailable()}")

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, head_dim=16)  # fmt: skip
CONFIGS = {
    "llama": LlamaConfig(**SMALL, attention_bias=True),
    "qwen2": Qwen2Config(**SMALL),  # q/k/v biases
    "mistral": MistralConfig(**SMALL, sliding_window=16),  # binds: the prompts run past it
    "qwen3": Qwen3Config(**SMALL),
    "granite": GraniteConfig(
        **SMALL,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=0.05,
        logits_scaling=8.0,
    ),
    "phi3": Phi3Config(**SMALL, pad_token_id=0, partial_rotary_factor=0.5),  # q/k/v and gate/up as one each
}
OTHERS = {
    "gemma": GemmaConfig(**SMALL),
    "olmo2": Olmo2Config(**SMALL),
}


def _checkpoint(config, path, dtype: torch.dtype = torch.float32):
    """A random checkpoint of `config`'s family whose norms are not the identity."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "norm" in name:
                weight.normal_(1, 0.1)
            else:
                weight.normal_(0, 0.1 if "embed" in name else 0.3)
    model.to(dtype).config.architectures = [type(model).__name__]
    model.save_pretrained(path)
    return path


def _runner(model_dir, dtype: str, attention_backend: str, **settings) -> ModelRunner:
    return ModelRunner(
        EngineConfig(
            str(model_dir),
            dtype=dtype,
            attention_backend=attention_backend,
            max_num_seqs=6,
            max_num_batched_tokens=48,
            block_size=8,
            **settings,
        )
    )


def _compare_paths(runner: ModelRunner) -> None:
    """Runs staggered requests, each step on both paths: equal logits, bitwise."""
    assert isinstance(runner.fast_path, DecoderStack)
    stack, execute = runner.fast_path, runner.execute
    compared = []

    def both_paths(work):
        # A step run twice writes the same keys and values: the second run sees the first's cache.
        runner.fast_path = None
        reference = execute(work)
        runner.fast_path = stack
        out = execute(work)
        assert torch.equal(out.logits, reference.logits)
        assert out.all_logits.keys() == reference.all_logits.keys()
        assert all(torch.equal(out.all_logits[i], reference.all_logits[i]) for i in out.all_logits)
        compared.append((sum(work.num_new), len(work)))
        return out

    runner.execute = both_paths
    prompts = [list(range(10, 80)), [5, 6, 7], list(range(100, 130)), [9] * 20]
    requests = [request(p, 12, SamplingParams()) for p in prompts]
    requests.append(request(list(range(40, 66)), 4, SamplingParams(return_context_logits=True)))
    run_all(runner, requests, stagger=True)
    assert any(tokens > seqs for tokens, seqs in compared)  # prefill chunks beside decodes
    assert any(tokens == seqs for tokens, seqs in compared)  # decode-only steps


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_step_through_the_stack_gives_the_module_paths_logits(model_dir, dtype, attention_backend):
    _compare_paths(_runner(model_dir, dtype, attention_backend))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", CONFIGS)
def test_each_family_through_the_stack_gives_its_module_paths_logits(tmp_path, family, dtype):
    path = _checkpoint(CONFIGS[family], tmp_path)
    runner = _runner(path, dtype, "auto")  # Mistral's window: sdpa; the others: cpu_paged
    assert runner.fast_path.family.prefix.lower() == family
    _compare_paths(runner)


def test_every_family_is_registered_for_its_architecture():
    stacked = {arch for (arch, platform), name in registry.FAST_PATHS.items() if name == DecoderStack.name}
    assert stacked == {f"{family.prefix}ForCausalLM" for family in FAMILIES}
    assert {family.module for family in FAMILIES} == set(CONFIGS)


@pytest.mark.parametrize("family", OTHERS)
def test_another_family_keeps_transformers_path_saying_why(tmp_path, family):
    runner = _runner(_checkpoint(OTHERS[family], tmp_path), "float32", "sdpa")
    assert runner.fast_path is None
    why = DecoderStack.build(runner.model, runner.attention, runner.platform)
    assert isinstance(why, str) and "does not have the modules of Llama, Qwen2" in why


def test_the_stack_is_for_fused_models_where_the_kernels_run(model_dir, monkeypatch):
    assert _runner(model_dir, "float32", "sdpa", fuse_projections=False).fast_path is None
    monkeypatch.setattr(cpu_kernels, "unavailable", lambda: "this CPU has no AVX-512F")
    assert _runner(model_dir, "float32", "sdpa").fast_path is None
