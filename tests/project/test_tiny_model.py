"""The generated tiny model: deterministic files, lossless tokenizer, chat template, greedy decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tritonlm.model_gen import tiny as tiny_model

FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
]

ROUNDTRIP = [
    "Hello, world! How are you today?",
    "  two leading spaces,\ttabs\tand\n\nblank lines  ",
    "def f(x: int) -> int:\n    return x ** 2  # square\n",
    "你好，世界！今天天气很好。",
    "こんにちは、世界。カタカナとひらがな。",
    "👍🏽 👨‍👩‍👧 🇯🇵🇫🇷 🏴󠁧󠁢󠁳󠁣󠁴󠁿 1️⃣ ❤️‍🔥",
    "mixed: 東京 is 18°C ☀️, cost €3.50 — ok?",
    "rare: 龘 𠀀 \x00 \x7f",
    "<think>markup</think> <tool_call>{}</tool_call>",
]


@pytest.fixture(scope="module")
def fresh_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model.generate(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="module")
def tokenizer(fresh_dir: Path):
    return AutoTokenizer.from_pretrained(fresh_dir)


@pytest.fixture(scope="module")
def model(fresh_dir: Path):
    return AutoModelForCausalLM.from_pretrained(fresh_dir).eval()


def test_files_are_byte_identical_across_runs(fresh_dir: Path, tmp_path: Path) -> None:
    again = tiny_model.generate(tmp_path / "again")
    for name in FILES:
        assert (again / name).read_bytes() == (fresh_dir / name).read_bytes(), name


def test_seed_changes_weights_not_tokenizer(fresh_dir: Path, tmp_path: Path) -> None:
    other = tiny_model.generate(tmp_path / "seed1", seed=1)
    assert (other / "tokenizer.json").read_bytes() == (fresh_dir / "tokenizer.json").read_bytes()
    assert (other / "model.safetensors").read_bytes() != (fresh_dir / "model.safetensors").read_bytes()


def test_config(fresh_dir: Path, tokenizer) -> None:
    config = json.loads((fresh_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["vocab_size"] == len(tokenizer) == tiny_model.VOCAB_SIZE
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # GQA
    assert config["tie_word_embeddings"] is False
    gen = json.loads((fresh_dir / "generation_config.json").read_text())
    assert gen["do_sample"] is False
    assert gen["eos_token_id"] == [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert "chat_template" in json.loads((fresh_dir / "tokenizer_config.json").read_text())
    assert 3_000_000 < tiny_model.count_parameters(fresh_dir) < 6_000_000


def test_special_tokens(tokenizer) -> None:
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|bos|>",
        "<|eos|>",
        "<|pad|>",
    )
    assert len({tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}) == 3
    for token in tiny_model.SPECIAL_TOKENS + tiny_model.MARKUP_TOKENS:
        assert len(tokenizer.encode(token)) == 1, token
    assert tokenizer.encode("hi")[0] != tokenizer.bos_token_id  # no BOS added implicitly
    # Chat markers are special (skipped), think/tool markup is not (the API parses it).
    ids = tokenizer.encode("<|im_start|>a<think>b</think><|im_end|>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a<think>b</think>"


@pytest.mark.parametrize("text", ROUNDTRIP)
def test_roundtrip(tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_some_tokens_split_characters(tokenizer) -> None:
    # Streaming must hold back partial UTF-8: make sure the tokenizer actually produces such tokens.
    pieces = [tokenizer.decode([i]) for i in tokenizer.encode("🏴󠁧󠁢󠁳󠁣󠁴󠁿 龘 こんにちは")]
    assert any("\ufffd" in p for p in pieces)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def test_chat_template(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "東京?"}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "東京"}},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18°C ☀️"},
        {"role": "assistant", "content": "Sunny 👍🏽"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert json.dumps(TOOLS[0], ensure_ascii=False) in text
    assert "<|im_start|>user\nWeather in 東京?<|im_end|>\n" in text
    assert (
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert '<|im_start|>tool\n<tool_response id="c1">\n18°C ☀️\n</tool_response><|im_end|>\n' in text
    assert text.endswith("<|im_start|>assistant\nSunny 👍🏽<|im_end|>\n<|im_start|>assistant\n")
    # The rendered prompt survives tokenization unchanged.
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_chat_template_generation_prompt_and_thinking(tokenizer) -> None:
    user = [{"role": "user", "content": "hi"}]
    render = tokenizer.apply_chat_template
    assert render(user, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n"
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render(user, tokenize=False, add_generation_prompt=True) == prompt
    thinking = render(user, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    assert thinking == prompt + "<think>\n"  # opt-in: the prompt opens the thought (DeepSeek-R1 style)
    no_think = render(user, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert no_think == prompt + "<think>\n\n</think>\n\n"


def test_greedy_generate_batched_matches_single(tokenizer, model) -> None:
    prompts = ["The lighthouse keeper", "def fibonacci(n):", "你好，世界", "👍🏽 great job"]
    single = []
    for p in prompts:
        ids = tokenizer(p, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=16, do_sample=False)
        assert out.shape == (1, ids.shape[1] + 16)  # a random model does not stop early here
        single.append(out[0, ids.shape[1] :].tolist())
    batch = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    out = model.generate(**batch, max_new_tokens=16, do_sample=False)
    assert out[:, batch.input_ids.shape[1] :].tolist() == single
    assert all(len(set(s)) > 4 for s in single)  # not a one-token loop


def test_logits_are_peaked(tokenizer, model) -> None:
    # Greedy parity between batched and single decoding needs clear top-1/top-2 margins.
    ids = tokenizer("Once upon a time", return_tensors="pt").input_ids
    with torch.no_grad():
        top2 = model(ids).logits[0].topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-3


def test_cli_skips_existing(fresh_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = (fresh_dir / "model.safetensors").stat().st_mtime_ns
    assert tiny_model.main([str(fresh_dir)]) == 0
    assert "already generated" in capsys.readouterr().out
    assert (fresh_dir / "model.safetensors").stat().st_mtime_ns == before
