"""Mixture-of-experts models on the experts implementation `moe_implementation` picks
(tritonlm/worker/moe.py): `auto` is our `grouped_linear` on the CPU (tokens grouped by expert, each
expert's projections by the linear methods), and greedy tokens through the engine equal
transformers `generate` on its per-expert loop (`eager`), fp32 exactly and bf16 up to a near tie,
for random 2-layer Qwen3-MoE, Mixtral and gpt-oss checkpoints made from their real config classes;
so do transformers' other implementations named. A model without experts ignores the setting."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from engine_helpers import fp32_runner, request, run_all
from test_bfloat16 import NEAR_TIE
from transformers import AutoModelForCausalLM, GptOssConfig, LlamaConfig, MixtralConfig, Qwen3MoeConfig

from tritonlm.config import ConfigError, EngineConfig
from tritonlm.platforms.cpu import cpu_has_native_bf16
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker import moe
from tritonlm.worker.model_runner import ModelRunner

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, head_dim=16)  # fmt: skip
FAMILIES = {
    "qwen3-moe": Qwen3MoeConfig(**SMALL, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32),
    "mixtral": MixtralConfig(**SMALL, num_local_experts=8, num_experts_per_tok=2),
    "gpt-oss": GptOssConfig(**SMALL, num_local_experts=8, num_experts_per_tok=2, sliding_window=128),
}
MAX_SEQ_LEN = 40


def checkpoint(family: str, path: Path, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, Path]:
    """A random checkpoint with weights large enough that the routing and the tokens vary; the
    reference loads it on transformers' per-expert loop."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(FAMILIES[family]))
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "norm" not in name:
                weight.normal_(0, 0.1 if "embed" in name else 0.3)
    model.config.architectures = [type(model).__name__]
    model.to(dtype).save_pretrained(path)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, experts_implementation="eager")
    assert reference.config._experts_implementation == "eager"
    return reference.eval(), path


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (17, 5, 24, 9)]


def generate(model: torch.nn.Module, prompt: list[int]) -> tuple[list[int], int]:
    """Greedy tokens to MAX_SEQ_LEN and how many come before the first near tie."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=MAX_SEQ_LEN - len(prompt), do_sample=False,
            eos_token_id=None, output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
    gaps = [float(step[0].float().topk(2).values.diff().abs()) for step in out.logits]
    return out.sequences[0, len(prompt) :].tolist(), next(
        (i for i, g in enumerate(gaps) if g < NEAR_TIE), len(gaps)
    )


def experts_of(runner: ModelRunner) -> str:
    return runner.model.config._experts_implementation


def engine_tokens(runner: ModelRunner, asked: list[list[int]]) -> list[list[int]]:
    # Staggered requests, prefill chunks of 16 beside decodes: groups of every size reach the experts.
    requests = [request(p, MAX_SEQ_LEN - len(p), SamplingParams()) for p in asked]
    _, seqs = run_all(runner, requests, stagger=True)
    return [s.output_ids for s in seqs]


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_groups_by_expert_and_equals_the_per_expert_loop(tmp_path, family):
    reference, path = checkpoint(family, tmp_path)
    refs = [generate(reference, p)[0] for p in prompts()]
    runner = fp32_runner(path, "auto", max_seq_len=MAX_SEQ_LEN, max_num_seqs=4, max_num_batched_tokens=16)
    assert experts_of(runner) == "grouped_linear"
    assert engine_tokens(runner, prompts()) == refs


@pytest.mark.parametrize("name", ["grouped_mm", "eager", "batched_mm"])
def test_each_named_implementation_loads_and_equals_the_loop(tmp_path, name):
    reference, path = checkpoint("qwen3-moe", tmp_path)
    refs = [generate(reference, p)[0] for p in prompts()]
    runner = fp32_runner(path, "auto", max_seq_len=MAX_SEQ_LEN, max_num_seqs=4, max_num_batched_tokens=16,
                         moe_implementation=name)  # fmt: skip
    assert experts_of(runner) == name
    assert engine_tokens(runner, prompts()) == refs


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bfloat16")
@pytest.mark.parametrize("family", ["qwen3-moe", "mixtral"])
def test_bfloat16_equals_the_loop_up_to_a_near_tie(tmp_path, family):
    """test_bfloat16.py's rule: bf16 runs may part where the two best logits are nearly tied."""
    reference, path = checkpoint(family, tmp_path, torch.bfloat16)
    refs = [generate(reference, p) for p in prompts()]
    config = EngineConfig(str(path), dtype="bfloat16", max_seq_len=MAX_SEQ_LEN, max_num_seqs=4,
                          max_num_batched_tokens=16)  # fmt: skip
    runner = ModelRunner(config)
    assert experts_of(runner) == "grouped_linear"
    compared = 0
    for tokens, (ref, clear) in zip(engine_tokens(runner, prompts()), refs, strict=True):
        assert tokens[:clear] == ref[:clear]
        compared += clear
    assert compared >= 8, refs  # not vacuous


def test_auto_is_grouped_mm_off_the_cpu():
    config = Qwen3MoeConfig(**SMALL)
    assert moe.experts_implementation("auto", AutoModelForCausalLM, config, "cuda") == "grouped_mm"
    assert moe.experts_implementation("auto", AutoModelForCausalLM, config, "cpu") == "grouped_linear"
    assert moe.experts_implementation("auto", AutoModelForCausalLM, LlamaConfig(**SMALL), "cpu") is None


def test_a_model_without_experts_ignores_the_setting(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SMALL))
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(tmp_path)
    runner = fp32_runner(tmp_path, "auto", max_seq_len=MAX_SEQ_LEN, moe_implementation="grouped_mm")
    assert runner.model.config.architectures == ["LlamaForCausalLM"]


def test_an_unknown_implementation_is_refused_naming_the_setting():
    with pytest.raises(ConfigError, match="moe_implementation"):
        EngineConfig(moe_implementation="loop")
