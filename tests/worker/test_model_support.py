"""Which checkpoints the engine serves (tritonlm/worker/model_support.py): a model no attention
backend serves (layers that are not attention, an encoder-decoder, attention outside transformers'
interface) is refused at start with a message naming the feature; what a model's attention needs
beyond causal softmax (a binding sliding window, soft-capping, sinks) is said, for the backend choice
(tests/worker/test_attention_features.py serves it); what is served exactly keeps starting. Each
config comes from its family's real transformers config class, small."""

from __future__ import annotations

import copy
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
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3NextConfig,
    T5Config,
)

from tritonlm.config import ConfigError
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker import cpu_kernels, model_support

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)  # fmt: skip
NO_KERNELS = cpu_kernels.unavailable()
HEAD = dict(head_dim=16)  # families whose default head_dim is not hidden / heads


def refusal(config, max_seq_len: int = 64) -> str:
    with pytest.raises(ConfigError) as error:
        model_support.check_config(config, max_seq_len)
    return str(error.value)


REFUSED = {
    # the same layer kind as Qwen3-Next's, in another family: its state is not assumed to be kept alike
    "qwen3.5": (
        Qwen3_5TextConfig(**SMALL, **HEAD, layer_types=["linear_attention", "full_attention"]),
        "Qwen3_5ForCausalLM",
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


NEEDS = {
    "mistral window": (MistralConfig(**SMALL, sliding_window=16), {"sliding_window"}),
    "gemma 2": (Gemma2Config(**SMALL, **HEAD, sliding_window=16), {"sliding_window", "softcap"}),
    "gemma 3": (Gemma3TextConfig(**SMALL, **HEAD, sliding_window=16), {"sliding_window"}),
    "gemma 3 multimodal": (
        Gemma3Config(text_config=Gemma3TextConfig(**SMALL, **HEAD, sliding_window=16)),
        {"sliding_window"},
    ),
    "gpt-oss": (
        GptOssConfig(**SMALL, **HEAD, sliding_window=16, num_local_experts=4, num_experts_per_tok=2),
        {"sliding_window", "sinks"},
    ),
    "gpt-oss within its window": (
        GptOssConfig(**SMALL, **HEAD, sliding_window=64, num_local_experts=4, num_experts_per_tok=2),
        {"sinks"},
    ),
}


@pytest.mark.parametrize("family", NEEDS)
def test_what_the_attention_needs_is_said_before_the_weights_load(family):
    config, features = NEEDS[family]
    assert set(model_support.check_config(config, max_seq_len=64)) == features


def test_the_needs_name_each_feature_found():
    assert model_support.check_config(Gemma2Config(**SMALL, **HEAD, sliding_window=16), max_seq_len=64) == {
        "sliding_window": "sliding-window attention (1 of 2 layers see only the last 16 tokens; none binds "
        "at max_seq_len <= 16)",
        "softcap": "attention logit soft-capping (attn_logit_softcapping 50.0)",
    }
    gpt_oss = NEEDS["gpt-oss within its window"][0]
    assert model_support.check_config(gpt_oss, 64)["sinks"] == (
        "attention sinks (transformers marks GptOssForCausalLM _supports_sdpa false, and the config shows "
        "no soft-capping)"
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
    # linear-attention layers, their state kept (worker/recurrent_state.py)
    "qwen3-next": Qwen3NextConfig(
        **SMALL, **HEAD, num_experts=4, num_experts_per_tok=2, full_attention_interval=2
    ),
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


# What make setup prepares (the bench model, made by make bench, has the tiny one's architecture).
@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "tiny"])
def test_the_projects_checkpoints_start(name):
    path = ROOT / "models" / name
    if not (path / "config.json").is_file():
        pytest.skip(f"{path} is not prepared (make setup)")
    model_support.check_config(AutoConfig.from_pretrained(path), max_seq_len=4096)


def test_the_window_binds_past_its_length_only():
    config = MistralConfig(**SMALL, sliding_window=16)
    assert model_support.check_config(config, max_seq_len=16) == {}  # position 15 still sees position 0
    assert "sliding_window" in model_support.check_config(config, max_seq_len=17)


def test_the_probe_says_what_the_layers_hand_the_attention_function():
    config = LlamaConfig(**SMALL)
    assert model_support.check_probe(config, {0: {}, 1: {"position_ids": 0}}, 64) == {}
    checks = [
        ("sinks", "attention sinks", {0: {"s_aux": torch.zeros(4)}, 1: {}}),
        ("softcap", "soft-capping (attn_logit_softcapping 30.0)", {0: {"softcap": 30.0}, 1: {}}),
        ("sliding_window", "1 of 2 layers see only the last 8 tokens", {0: {"sliding_window": 8}, 1: {}}),
    ]
    for feature, what, handed in checks:
        assert what in model_support.check_probe(config, handed, 64)[feature]
    assert model_support.check_probe(config, {0: {"sliding_window": 64}, 1: {}}, 64) == {}  # never binds
    # Qwen3-Next's linear-attention layers never call it: their state is kept (recurrent_layers)
    qwen3_next = SERVED["qwen3-next"]
    assert model_support.recurrent_layers(qwen3_next) == [0]
    assert model_support.check_probe(qwen3_next, {1: {}}, 64) == {}
    silent = "^LlamaForCausalLM is not served exactly: 1 of 2 layers that never"
    with pytest.raises(ConfigError, match=silent):
        model_support.check_probe(config, {0: {}}, 64)
    # transformers' mark of attention beyond SDPA, which the layers show as neither cap nor sinks
    gpt_oss = GptOssConfig(**SMALL, **HEAD, num_local_experts=4, num_experts_per_tok=2)
    with pytest.raises(ConfigError, match="_supports_sdpa false.* as neither soft-capping nor sinks"):
        model_support.check_probe(gpt_oss, {0: {}, 1: {}}, 64)


def save(model: torch.nn.Module, path: Path) -> Path:
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(path)
    return path


@pytest.mark.skipif(NO_KERNELS is not None, reason=f"cpu_paged does not run here: {NO_KERNELS}")
@pytest.mark.parametrize(
    "config, feature",
    [
        (MistralConfig(**SMALL, sliding_window=16, architectures=["MistralForCausalLM"]), "sliding-window"),
        (GptOssConfig(**SMALL, **HEAD, sliding_window=64, architectures=["GptOssForCausalLM"]), "sinks"),
    ],
)
def test_a_backend_named_that_lacks_a_feature_is_refused_before_the_weights_load(tmp_path, config, feature):
    # config.json alone: a refusal after loading would be a missing-weights error instead.
    config.save_pretrained(tmp_path)
    with pytest.raises(
        ConfigError,
        match=f"^attention_backend: 'cpu_paged' cannot serve this checkpoint exactly: it does not compute "
        f".*{feature}.*; 'sdpa' does \\(attention_backend: sdpa or auto\\)$",
    ):
        fp32_runner(tmp_path, "cpu_paged", max_seq_len=64)


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
