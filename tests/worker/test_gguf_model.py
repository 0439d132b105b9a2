"""A GGUF file served as a model (tritonlm/gguf_checkpoint.py, tritonlm/worker/gguf_weights.py): the
directory written from its metadata reads as the checkpoint it came from (config, tokenizer, chat
template), and its weights, the 4-bit types, Q8_0 and Q6_K kept quantized, compute what transformers
computes from the same file dequantized."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tests.gguf_helpers import mixed_types, write_llama_gguf
from tritonlm import gguf_checkpoint as checkpoint
from tritonlm.settings import ConfigError
from tritonlm.worker import fused
from tritonlm.worker import gguf_weights as weights

CORPUS = Path(__file__).resolve().parents[2] / "corpus"


@pytest.fixture(scope="module")
def mixed(model_dir, tmp_path_factory) -> tuple[Path, Path]:
    """The tiny model as one GGUF file of every type, and the directory written for it."""
    folder = tmp_path_factory.mktemp("gguf")
    file = write_llama_gguf(model_dir, folder / "tiny-mixed.gguf", mixed_types)
    return file, checkpoint.prepare(file, folder / "cache")


def test_the_written_directory_reads_as_the_original(model_dir, mixed):
    file, written = mixed
    assert checkpoint.weights_file(written) == file and checkpoint.prepare(file, written.parent) == written
    ours, original = AutoTokenizer.from_pretrained(written), AutoTokenizer.from_pretrained(model_dir)
    texts = [path.read_text()[:2000] for path in sorted(CORPUS.iterdir())] + ["<|im_start|>a<think>b</think>"]
    assert all(ours(t)["input_ids"] == original(t)["input_ids"] for t in texts)
    chat = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(chat, tokenize=False) == original.apply_chat_template(
        chat, tokenize=False
    )
    config, expected = AutoConfig.from_pretrained(written), AutoConfig.from_pretrained(model_dir)
    assert config.architectures == ["LlamaForCausalLM"]
    for field in ("hidden_size", "num_hidden_layers", "num_key_value_heads", "vocab_size", "eos_token_id"):
        assert getattr(config, field) == getattr(expected, field), field


def _ours(written: Path, dtype: torch.dtype) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(written)
    model = weights.load(checkpoint.weights_file(written), config, dtype, True, attn_implementation="sdpa")
    fused.fuse(model)
    fused.hold_quantized(model)
    return model.eval()


def test_weights_compute_what_transformers_computes_from_the_file(mixed, caplog):
    file, written = mixed
    with caplog.at_level(logging.INFO):
        ours = _ours(written, torch.float32)
    # blk.2's BF16 o_proj is dense; the Q6_K is the LM head
    assert "kept quantized: 7 Q4_0, 7 Q4_1, 6 Q4_K, 1 Q6_K, 6 Q8_0;" in caplog.text
    assert "dequantized to torch.float32: 1 Q5_K" in caplog.text
    methods = {m.projection.method for m in ours.modules() if isinstance(m, fused.PackedLinear)}
    assert methods >= {"int4", "gguf"}
    assert ours.lm_head.projection.method == "gguf"
    reference = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32)
    ids = torch.arange(3, 300, 7)[None]
    with torch.inference_mode():
        got, expected = ours(ids).logits, reference.eval()(ids).logits
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    with torch.inference_mode():
        half = _ours(written, torch.bfloat16)(ids).logits.float()
    assert (half.argmax(-1) == expected.argmax(-1)).float().mean() > 0.9  # bf16: near-ties may part


def test_a_directory_names_its_one_gguf_file(tmp_path, mixed):
    file, _ = mixed
    assert checkpoint.source(file) == file and checkpoint.source(file.parent / "cache") is None
    (tmp_path / "a.gguf").symlink_to(file)
    assert checkpoint.source(tmp_path) == file
    (tmp_path / "b.gguf").symlink_to(file)
    with pytest.raises(ConfigError, match="holds 2 GGUF files; name one: a.gguf, b.gguf"):
        checkpoint.source(tmp_path)


def test_a_file_missing_a_tensor_is_refused_naming_it(model_dir, tmp_path):
    file = write_llama_gguf(
        model_dir, tmp_path / "t.gguf", mixed_types, drop=frozenset({"blk.1.ffn_up.weight"})
    )
    written = checkpoint.prepare(file, tmp_path / "cache")
    with pytest.raises(ConfigError, match=r"t.gguf has no tensor for model.layers.1.mlp.up_proj.weight"):
        _ours(written, torch.float32)
