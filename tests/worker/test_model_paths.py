"""Model paths (tritonlm/worker/model_paths): the registry from (architecture, platform) to the code
that runs a forward step, the `model_path` setting, and parity: the engine's greedy tokens on every
path equal transformers `generate`, under concurrency, chunked prefill and preemption."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import fp32_runner, request, run_all
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from tritonlm import platforms
from tritonlm.config import ConfigError, EngineConfig
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker import cpu_kernels, fused, model_paths
from tritonlm.worker.attention.sdpa import SdpaBackend
from tritonlm.worker.model_paths import registry
from tritonlm.worker.model_paths.base import ModelPath
from tritonlm.worker.model_paths.decoder_stack import DecoderStack
from tritonlm.worker.model_paths.generic import TransformersPath

CPU = platforms.of(torch.device("cpu"))
NO_KERNELS = cpu_kernels.unavailable()
# The paths that run the tiny Llama here: both where our kernels run.
PATHS = ["transformers"] + (["decoder_stack"] if NO_KERNELS is None else [])


def test_every_registered_path_is_a_model_path_of_its_name():
    for name in registry.PATHS:
        cls = model_paths.path_class(name)
        assert issubclass(cls, ModelPath) and cls.name == name
    for (_, platform), name in registry.FAST_PATHS.items():
        assert name in registry.PATHS and platform in platforms.PLATFORMS


def test_the_setting_names_a_path():
    names = ", ".join(registry.NAMES)
    with pytest.raises(ConfigError, match=rf"model_path: must be one of {names}, got 'fast'"):
        EngineConfig(model_path="fast")
    assert EngineConfig.from_parameters({"model_path": "transformers"}, {}).model_path == "transformers"


@pytest.fixture(scope="module")
def fused_llama(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    fused.fuse(model)
    return model


def test_auto_takes_the_architectures_fast_path_on_its_platform(fused_llama):
    attention = SdpaBackend(16, torch.float32, CPU.device)
    path = model_paths.fast_path("auto", fused_llama, attention, CPU)
    assert isinstance(path, DecoderStack) if NO_KERNELS is None else path is None
    assert model_paths.fast_path("transformers", fused_llama, attention, CPU) is None


def test_an_architecture_without_a_fast_path_runs_through_transformers():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).eval()
    attention = SdpaBackend(16, torch.float32, CPU.device)
    assert model_paths.architecture(gpt2) == "GPT2LMHeadModel"
    assert model_paths.fast_path("auto", gpt2, attention, CPU) is None
    with pytest.raises(ValueError, match="model_path: 'decoder_stack' cannot run this model: "):
        model_paths.fast_path("decoder_stack", gpt2, attention, CPU)
    assert isinstance(TransformersPath.build(gpt2, attention, CPU), TransformersPath)


def test_a_named_fast_path_that_cannot_run_fails_at_start(model_dir):
    with pytest.raises(ValueError, match=r"model_path: .decoder_stack. cannot run this model: .*; allowed"):
        fp32_runner(model_dir, "sdpa", model_path="decoder_stack", fuse_projections=False)


@pytest.mark.parametrize("model_path", PATHS)
def test_greedy_on_every_path_equals_transformers_generate(model_dir, model_path):
    reference = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(5, 4000, (int(n),), generator=gen).tolist() for n in (3, 17, 40, 9, 28, 55)]
    with torch.no_grad():
        refs = [
            reference.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None)[
                0, len(p) :
            ].tolist()
            for p in prompts
        ]
    # Chunked prefill beside decodes, and a cache that holds about two sequences: preemption.
    runner = fp32_runner(
        model_dir, "auto", model_path=model_path, max_num_seqs=4, max_num_batched_tokens=16,
        max_seq_len=96, kv_cache_blocks=8,
    )  # fmt: skip
    assert (runner.fast_path.name if runner.fast_path else "transformers") == model_path
    engine, seqs = run_all(runner, [request(p, 12, SamplingParams()) for p in prompts], stagger=True)
    assert [s.output_ids for s in seqs] == refs
    assert engine.stats()["preemptions"] > 0
