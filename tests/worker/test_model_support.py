"""Which checkpoints the engine serves (tritonlm/worker/model_support.py): a model the attention
backends would serve wrongly (a binding sliding window, soft-capping, sinks, layers that are not
attention, an encoder-decoder, attention outside transformers' interface) is refused at start with
a message naming the feature; what is served exactly keeps starting. Each config comes from its
family's real transformers config class, small."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
from engine_helpers import fp32_runner, request, run_all
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    BartConfig,
    BloomConfig,
    Gemma2Config,
    Gemma3Config,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPTNeoXConfig,
    GptOssConfig,
    GraniteConfig,
    Lfm2Config,
    LlamaConfig,
    LlavaConfig,
    LlavaOnevisionConfig,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    Olmo2Config,
    Phi3Config,
    Qwen2AudioConfig,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3NextConfig,
    T5Config,
)

from tritonlm.config import ConfigError
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker import model_support

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)  # fmt: skip
HEAD = dict(head_dim=16)  # families whose default head_dim is not hidden / heads


def refusal(config, max_seq_len: int = 64) -> str:
    with pytest.raises(ConfigError) as error:
        model_support.check_config(config, max_seq_len)
    return str(error.value)


REFUSED = {
    "mistral window": (MistralConfig(**SMALL, sliding_window=16), "MistralForCausalLM", "sliding-window"),
    "gemma 2": (Gemma2Config(**SMALL, **HEAD, sliding_window=16), "Gemma2ForCausalLM", "soft-capping"),
    "gemma 3": (Gemma3TextConfig(**SMALL, **HEAD, sliding_window=16), "Gemma3ForCausalLM", "sliding-window"),
    "gemma 3 multimodal": (
        Gemma3Config(text_config=Gemma3TextConfig(**SMALL, **HEAD, sliding_window=16)),
        "Gemma3ForConditionalGeneration",
        "sliding-window",
    ),
    "gpt-oss": (
        GptOssConfig(**SMALL, **HEAD, sliding_window=16, num_local_experts=4, num_experts_per_tok=2),
        "GptOssForCausalLM",
        "sliding-window",
    ),
    "qwen3-next": (
        Qwen3NextConfig(**SMALL, **HEAD, num_experts=4, num_experts_per_tok=2, full_attention_interval=2),
        "Qwen3NextForCausalLM",
        "linear_attention: 1 of 2 layers",
    ),
    "lfm2": (Lfm2Config(**SMALL, layer_types=["conv", "full_attention"]), "Lfm2ForCausalLM", "conv: 1 of 2"),
    "t5": (T5Config(d_model=64, num_layers=2, num_heads=4, vocab_size=256), "T5Config", "encoder-decoder"),
    "bart": (
        BartConfig(d_model=64, encoder_layers=2, decoder_layers=2),
        "BartForCausalLM",
        "encoder-decoder",
    ),
    "bloom": (
        BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=256),
        "BloomForCausalLM",
        "does not mark BloomForCausalLM _supports_attention_backend",
    ),  # fmt: skip
    "gpt-oss within its window": (
        GptOssConfig(**SMALL, **HEAD, sliding_window=64, num_local_experts=4, num_experts_per_tok=2),
        "GptOssForCausalLM",
        "marks GptOssForCausalLM _supports_sdpa false, as for sinks",
    ),
    "bidirectional": (
        Gemma3TextConfig(**SMALL, **HEAD, sliding_window=256, use_bidirectional_attention=True),
        "Gemma3ForCausalLM",
        "bidirectional attention",
    ),
}


@pytest.mark.parametrize("family", REFUSED)
def test_a_feature_the_backends_do_not_serve_is_refused_naming_it(family):
    config, name, feature = REFUSED[family]
    message = refusal(config)
    assert message.startswith(name) and feature in message, message
    assert "Served: decoder-only models" in message


def test_the_messages_name_each_feature_found():
    message = refusal(Gemma2Config(**SMALL, **HEAD, sliding_window=16), max_seq_len=64)
    assert message == (
        "Gemma2ForCausalLM is not served exactly: attention beyond plain softmax attention (transformers "
        "marks Gemma2ForCausalLM _supports_sdpa false, as for sinks or soft-capping), which is all the "
        "backends compute; attention logit soft-capping (attn_logit_softcapping 50.0): the backends do "
        "not cap; sliding-window attention (1 of 2 layers see only the last 16 "
        "tokens), which the backends do not apply: set max_seq_len <= 16 (it is 64), where no window "
        f"binds and the model is served exactly. {model_support.SERVED}."
    )


SERVED = {
    "llama": LlamaConfig(**SMALL),
    "qwen2": Qwen2Config(**SMALL),
    "qwen2 window off": Qwen2Config(**SMALL, use_sliding_window=False, sliding_window=16),
    # the switch on, but no layer past max_window_layers: transformers applies no window
    "qwen2 window below max_window_layers": Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=16),
    "qwen3": Qwen3Config(**SMALL, **HEAD),
    "phi-3": Phi3Config(**SMALL, pad_token_id=0),
    "olmo 2": Olmo2Config(**SMALL),
    "granite": GraniteConfig(**SMALL),
    "qwen3-moe": Qwen3MoeConfig(**SMALL, **HEAD, num_experts=4, num_experts_per_tok=2),
    "mixtral": MixtralConfig(**SMALL, num_local_experts=4),
    "gpt-neox": GPTNeoXConfig(**SMALL),
    "gpt-2": GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256),
    "llava": LlavaConfig(text_config=LlamaConfig(**SMALL)),
    "llava-onevision": LlavaOnevisionConfig(text_config=Qwen2Config(**SMALL)),
    "qwen2-audio": Qwen2AudioConfig(text_config=Qwen2Config(**SMALL)),
    "mistral without a window": MistralConfig(**SMALL, sliding_window=None),
    "mistral, max_seq_len within the window": MistralConfig(**SMALL, sliding_window=64),
    "gemma 3, max_seq_len within the window": Gemma3TextConfig(**SMALL, **HEAD, sliding_window=64),
}


@pytest.mark.parametrize("family", SERVED)
def test_what_is_served_exactly_starts(family):
    model_support.check_config(SERVED[family], max_seq_len=64)


@pytest.mark.parametrize(
    "family", ["qwen2", "qwen3", "phi-3", "olmo 2", "granite", "qwen3-moe", "mixtral", "gpt-neox", "gpt-2"]
)
def test_the_families_served_today_start_through_the_runner(tmp_path, family):
    """Their probe forward included: every layer calls the attention function, handing it nothing refused."""
    torch.manual_seed(0)
    path = save(AutoModelForCausalLM.from_config(copy.deepcopy(SERVED[family])), tmp_path)
    runner = fp32_runner(path, "sdpa", max_seq_len=128)
    assert sorted(runner.attention.handed) == [0, 1]


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "tiny", "bench"])
def test_the_projects_checkpoints_start(name):
    path = ROOT / "models" / name
    if not (path / "config.json").is_file():
        pytest.skip(f"{path} is not prepared (make setup)")
    model_support.check_config(AutoConfig.from_pretrained(path), max_seq_len=4096)


def test_the_window_binds_past_its_length_only():
    config = MistralConfig(**SMALL, sliding_window=16)
    model_support.check_config(config, max_seq_len=16)  # position 15 still sees position 0
    assert "set max_seq_len <= 16 (it is 17)" in refusal(config, max_seq_len=17)


def test_the_probe_refuses_what_the_layers_hand_the_attention_function():
    config = LlamaConfig(**SMALL)
    model_support.check_probe(config, {0: {}, 1: {"position_ids": 0}}, 64)
    window = "sliding-window attention (1 of 2 layers see only the last 8 tokens)"
    checks = [
        ("attention sinks", {0: {"s_aux": torch.zeros(4)}, 1: {}}),
        ("soft-capping (attn_logit_softcapping 30.0)", {0: {"softcap": 30.0}, 1: {}}),
        (window, {0: {"sliding_window": 8}, 1: {}}),
        ("1 of 2 layers that never call the attention function", {0: {}}),
    ]
    for feature, handed in checks:
        with pytest.raises(
            ConfigError, match="^LlamaForCausalLM is not served exactly: .*" + re.escape(feature)
        ):
            model_support.check_probe(config, handed, 64)
    model_support.check_probe(config, {0: {"sliding_window": 64}, 1: {}}, 64)  # never binds


def save(model: torch.nn.Module, path: Path) -> Path:
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize(
    "config, feature",
    [
        (MistralConfig(**SMALL, sliding_window=16, architectures=["MistralForCausalLM"]), "sliding-window"),
        (GptOssConfig(**SMALL, **HEAD, sliding_window=64, architectures=["GptOssForCausalLM"]), "sinks"),
    ],
)
def test_the_runner_refuses_before_the_weights_load(tmp_path, config, feature):
    # config.json alone: a refusal after loading would be a missing-weights error instead.
    config.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=f"^{config.architectures[0]} is not served exactly: .*{feature}"):
        fp32_runner(tmp_path, "sdpa", max_seq_len=64)


WITHIN_WINDOW = {
    "mistral": lambda: MistralForCausalLM(MistralConfig(**SMALL, sliding_window=48)),
    "gemma 3": lambda: Gemma3ForCausalLM(Gemma3TextConfig(**SMALL, **HEAD, sliding_window=48)),
}


@pytest.mark.parametrize("family", WITHIN_WINDOW)
def test_a_window_that_never_binds_is_served_exactly(tmp_path, attention_backend, family):
    """max_seq_len = the window: greedy tokens equal transformers generate (which applies it)."""
    torch.manual_seed(0)
    model = WITHIN_WINDOW[family]().eval()
    path = save(model, tmp_path)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (5, 21, 30, 12)]
    with torch.no_grad():
        refs = [
            model.generate(torch.tensor([p]), max_new_tokens=48 - len(p), do_sample=False, eos_token_id=None)[
                0, len(p) :
            ].tolist()
            for p in prompts
        ]
    runner = fp32_runner(path, attention_backend, max_seq_len=48, max_num_seqs=4, max_num_batched_tokens=16)
    _, seqs = run_all(runner, [request(p, 48 - len(p), SamplingParams()) for p in prompts], stagger=True)
    assert [s.output_ids for s in seqs] == refs
